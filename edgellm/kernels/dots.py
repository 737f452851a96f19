"""Float dot products of 16 rows with one vector at a time, for decode attention's scores.

A numba loop `for i in range(Dh): acc += q[i] * k[i]` vectorizes over i and then sums the
vector's lanes: for one query head and one cached key that horizontal sum costs as much as
the multiply-adds themselves (Dh = 64: 4 of them). `dots16` keeps 16 keys' partial sums in
16 vectors and sums them all at once with a transposing tree (15 pairwise steps of two
shuffles and an add), whose result has key r's sum in lane r:

  dots16(K, s0, q, g, out, o0, scale)
      out[g, o0 + r] = scale * (K[s0 + r, :D] . q[g, :D])   for r < 16,  D = q.shape[1]

K [n, >= D] and q [., D] are float32 with unit column stride (rows may be strided: a KV
head's view of the cache); D % 16 == 0. The caller checks shapes, strides and bounds.
"""

from __future__ import annotations

from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from .ir import F32, FAST, _c, _i64, _load, _loop, _pick, _Rows, _splat, _v

LANES = 16  # keys per call, and float32 lanes per vector


def _transpose_sum(b, vecs):
    """16 vectors of 16 lanes -> one vector whose lane r is the sum of vecs[r]'s lanes.

    Each step pairs neighbours: a vector holding m keys' partial sums in L lanes each and
    its neighbour become one holding 2m keys in L/2 lanes each (a's keys, then b's), by
    adding the first and second halves of every key's lanes.
    """
    L = LANES
    while len(vecs) > 1:
        m = LANES // L
        lo = [j * L + u for j in range(m) for u in range(L // 2)]
        lo = lo + [LANES + i for i in lo]
        hi = [i + L // 2 for i in lo]
        vecs = [b.fadd(_pick(b, vecs[k], lo, vecs[k + 1]), _pick(b, vecs[k], hi, vecs[k + 1]),
                       flags=FAST)
                for k in range(0, len(vecs), 2)]
        L //= 2
    return vecs[0]


def _dots16_codegen(ctx, b, sig, args):
    K, q, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 4))
    s0, g, o0, scale = args[1], args[3], args[5], args[6]
    v16 = _v(F32, LANES)
    krow = [K.row(b.add(s0, _i64(r))) for r in range(LANES)]
    qrow = q.row(g)

    def body(c, acc):
        off = b.mul(c, _i64(4 * LANES))
        qv = _load(b, qrow, off, v16)
        return [b.fadd(a, b.fmul(_load(b, k, off, v16), qv, flags=FAST), flags=FAST)
                for a, k in zip(acc, krow, strict=True)]

    init = [_c(v16, [0.0] * LANES)] * LANES
    acc = _loop(b, b.sdiv(q.cols, _i64(LANES)), init, body)[0]
    res = b.fmul(_transpose_sum(b, acc), _splat(b, scale, LANES), flags=FAST)
    p = b.gep(out.row(g), [b.mul(o0, _i64(4))], inbounds=True)
    b.store(res, b.bitcast(p, v16.as_pointer()), align=4)
    return ctx.get_dummy_value()


@intrinsic
def dots16(typingctx, K, s0, q, g, out, o0, scale):
    for name, a in (("K", K), ("q", q), ("out", out)):
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32):
            raise TypingError(f"dots16: {name} must be a 2-D float32 array, got {a}")
    for name, a in (("s0", s0), ("g", g), ("o0", o0)):
        if not isinstance(a, types.Integer):
            raise TypingError(f"dots16: {name} must be an integer, got {a}")
    if not isinstance(scale, types.Float):
        raise TypingError(f"dots16: scale must be a float, got {scale}")
    sig = types.none(K, types.int64, q, types.int64, out, types.int64, types.float32)
    return sig, _dots16_codegen
