"""Float row kernels of decode attention: 16 keys' dot products with a query (the scores),
and a weighted sum of value rows (the output).

A numba loop `for i in range(Dh): acc += q[i] * k[i]` vectorizes over i and then sums the
vector's lanes: for one query head and one cached key that horizontal sum costs as much as
the multiply-adds themselves (Dh = 64: 4 of them). `dots16` keeps 16 keys' partial sums in
16 vectors (AVX2: 8 keys' in 8 vectors, twice) and sums them all at once with a transposing
tree (pairwise steps of two shuffles and an add), whose result has key r's sum in lane r:

  dots16(K, s0, q, g, out, o0, scale)
      out[g, o0 + r] = scale * (K[s0 + r, :D] . q[g, :D])   for r < 16,  D = q.shape[1]

K [n, >= D] and q [., D] are float32 with unit column stride (rows may be strided: a KV
head's view of the cache), or K float16 bits (uint16: an f16 cache's rows, converted as they
are loaded, exactly: the float32 rows' products and sums); D % 16 == 0. The caller checks
shapes, strides and bounds.

  wsum_rows(V, r0, m, W, g, w0, out, og)
      out[og, :D] += sum over j < m of W[g, w0 + j] * V[r0 + j, :D]   D = out.shape[1]

The same layouts (any D; V float32 or f16 bits as K): a numba loop over a strided view's
row does not vectorize (its stride is a runtime value), and summing four rows per pass over
out costs a load and a store of out per four rows; here 64 columns of out stay in 4 vectors
(8 chains of fused multiply-adds on AVX2) over all m rows, then 16 at a time, then the last
D % 16 one by one.
"""

from __future__ import annotations

from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..codegen.ir import (
    F32,
    FAST,
    I16,
    _c,
    _for,
    _h2f,
    _i64,
    _load,
    _loop,
    _pick,
    _prefetch,
    _Rows,
    _splat,
    _v,
)
from ..runtime.simd import VNNI

LANES = 16  # keys per call, and float32 lanes per vector
# lanes of dots16's accumulators, one per key: 16 keys' 16-lane vectors are all 32 of
# AVX-512's registers, but twice AVX2's 16 (they spill), so there 8 keys per pass
ACC = LANES if VNNI else 8


def _row_load(b, row, off, n, half):
    """n float32 columns at float32 byte offset off of a row: float32, or (half) float16
    bits at half the offset, converted."""
    if not half:
        return _load(b, row, off, _v(F32, n) if n > 1 else F32)
    bits = _load(b, row, b.sdiv(off, _i64(2)), _v(I16, n) if n > 1 else I16)
    return _h2f(b, bits)


def _rows_type(name, a):
    """TypingError unless a is a 2-D float32 or (f16 bits) uint16 array."""
    if not (isinstance(a, types.Array) and a.ndim == 2
            and a.dtype in (types.float32, types.uint16)):
        raise TypingError(f"{name} must be a 2-D float32 or uint16 (f16) array, got {a}")


def _transpose_sum(b, vecs):
    """n vectors of n lanes -> one vector whose lane r is the sum of vecs[r]'s lanes.

    Each step pairs neighbours: a vector holding m keys' partial sums in L lanes each and
    its neighbour become one holding 2m keys in L/2 lanes each (a's keys, then b's), by
    adding the first and second halves of every key's lanes.
    """
    n = vecs[0].type.count
    assert len(vecs) == n
    L = n
    while len(vecs) > 1:
        m = n // L
        lo = [j * L + u for j in range(m) for u in range(L // 2)]
        lo = lo + [n + i for i in lo]
        hi = [i + L // 2 for i in lo]
        vecs = [b.fadd(_pick(b, vecs[k], lo, vecs[k + 1]), _pick(b, vecs[k], hi, vecs[k + 1]),
                       flags=FAST)
                for k in range(0, len(vecs), 2)]
        L //= 2
    return vecs[0]


def _dots16_codegen(ctx, b, sig, args):
    K, q, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 4))
    s0, g, o0, scale = args[1], args[3], args[5], args[6]
    half = sig.args[0].dtype == types.uint16
    vacc = _v(F32, ACC)
    qrow = q.row(g)
    sums = []
    for r0 in range(0, LANES, ACC):  # ACC keys per pass over q
        krow = [K.row(b.add(s0, _i64(r0 + r))) for r in range(ACC)]

        def body(c, acc, krow=krow):
            off = b.mul(c, _i64(4 * ACC))
            qv = _load(b, qrow, off, vacc)
            return [b.fadd(a, b.fmul(_row_load(b, k, off, ACC, half), qv, flags=FAST),
                           flags=FAST)
                    for a, k in zip(acc, krow, strict=True)]

        init = [_c(vacc, [0.0] * ACC)] * ACC
        acc = _loop(b, b.sdiv(q.cols, _i64(ACC)), init, body)[0]
        sums.append(_transpose_sum(b, acc))
    res = sums[0] if len(sums) == 1 else _pick(b, sums[0], range(LANES), sums[1])
    res = b.fmul(res, _splat(b, scale, LANES), flags=FAST)
    p = b.gep(out.row(g), [b.mul(o0, _i64(4))], inbounds=True)
    b.store(res, b.bitcast(p, _v(F32, LANES).as_pointer()), align=4)
    return ctx.get_dummy_value()


@intrinsic
def dots16(typingctx, K, s0, q, g, out, o0, scale):
    _rows_type("dots16: K", K)
    for name, a in (("q", q), ("out", out)):
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32):
            raise TypingError(f"dots16: {name} must be a 2-D float32 array, got {a}")
    for name, a in (("s0", s0), ("g", g), ("o0", o0)):
        if not isinstance(a, types.Integer):
            raise TypingError(f"dots16: {name} must be an integer, got {a}")
    if not isinstance(scale, types.Float):
        raise TypingError(f"dots16: scale must be a float, got {scale}")
    sig = types.none(K, types.int64, q, types.int64, out, types.int64, types.float32)
    return sig, _dots16_codegen


def _wsum_rows_codegen(ctx, b, sig, args):
    V, W, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 3, 6))
    r0, m, g, w0, og = args[1], args[2], args[4], args[5], args[7]
    half = sig.args[0].dtype == types.uint16
    wrow, orow = W.row(g), out.row(og)

    def chunks(c0, c1, width):
        """Columns [c0 * width, c1 * width) in chunks of `width` floats (64 or 16: vectors of
        16 lanes; 1: scalars)."""
        parts = max(1, width // LANES)
        pt = _v(F32, LANES) if width > 1 else F32

        def chunk(c, st):
            base = b.mul(c, _i64(4 * width))
            offs = [b.add(base, _i64(4 * LANES * k)) for k in range(parts)]
            acc = [_load(b, orow, o, pt) for o in offs]

            def row(j, acc):
                wj = _load(b, wrow, b.mul(b.add(w0, j), _i64(4)), F32)
                w = _splat(b, wj, LANES) if width > 1 else wj
                vr = V.row(b.add(r0, j))
                return [b.fadd(a, b.fmul(w, _row_load(b, vr, o, pt.count if width > 1 else 1,
                                                     half), flags=FAST), flags=FAST)
                        for a, o in zip(acc, offs, strict=True)]

            acc = _for(b, _i64(0), m, acc, row)
            for a, o in zip(acc, offs, strict=True):
                p = b.gep(orow, [o], inbounds=True)
                b.store(a, b.bitcast(p, pt.as_pointer()), align=4)
            return st

        _for(b, c0, c1, [], chunk)

    D = out.cols
    n64 = b.sdiv(D, _i64(4 * LANES))
    n16 = b.sdiv(D, _i64(LANES))
    chunks(_i64(0), n64, 4 * LANES)
    chunks(b.mul(n64, _i64(4)), n16, LANES)
    chunks(b.mul(n16, _i64(LANES)), D, 1)
    return ctx.get_dummy_value()


@intrinsic
def wsum_rows(typingctx, V, r0, m, W, g, w0, out, og):
    _rows_type("wsum_rows: V", V)
    for name, a in (("W", W), ("out", out)):
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32):
            raise TypingError(f"wsum_rows: {name} must be a 2-D float32 array, got {a}")
    for name, a in (("r0", r0), ("m", m), ("g", g), ("w0", w0), ("og", og)):
        if not isinstance(a, types.Integer):
            raise TypingError(f"wsum_rows: {name} must be an integer, got {a}")
    i64 = types.int64
    sig = types.none(V, i64, i64, W, i64, i64, out, i64)
    return sig, _wsum_rows_codegen


def _prefetch_rows_codegen(ctx, b, sig, args):
    A = _Rows(ctx, b, sig.args[0], args[0])
    s, m = args[1], args[2]
    nbytes = b.mul(A.cols, _i64(sig.args[0].dtype.bitwidth // 8))

    def row(j, st):
        r = A.row(b.add(s, j))

        def line(c, st):
            _prefetch(b, b.gep(r, [b.mul(c, _i64(64))]), level=2)
            return st

        _for(b, _i64(0), b.sdiv(b.add(nbytes, _i64(63)), _i64(64)), [], line)
        return st

    _for(b, _i64(0), m, [], row)
    return ctx.get_dummy_value()


@intrinsic
def prefetch_rows(typingctx, A, s, m):
    """Hint rows s .. s + m - 1 of the 2-D array A (rows may be strided: a KV head's view
    of the cache) into L2 (as ir._prefetch_ahead), every line of each row's columns: a KV
    head's rows are a fraction of each cache row, a pattern the hardware prefetcher
    follows badly. A hint: never faults, so rows past A's end are harmless."""
    if not (isinstance(A, types.Array) and A.ndim == 2):
        raise TypingError(f"prefetch_rows: A must be a 2-D array, got {A}")
    for name, a in (("s", s), ("m", m)):
        if not isinstance(a, types.Integer):
            raise TypingError(f"prefetch_rows: {name} must be an integer, got {a}")
    return types.none(A, types.int64, types.int64), _prefetch_rows_codegen
