"""Register-blocked tiles of prefill attention: four query rows at a time against keys
stored transposed (the scores), and against value rows (the weighted sums).

    qk_tile(KT, s0, Q, q0, out)
        out[q0 + i, s0 + j] = Q[q0 + i, :D] . KT[:D, s0 + j]    i < 4, j < KW
    pv_tile(V, m, P, q0, out)
        out[q0 + i, :D] += sum over j < m of P[q0 + i, j] V[j, :D]    i < 4
    row_max(A, r, n)
        max(A[r, :n]) (a float32 max that vectorizes: numba's loop of max() does not)

D = Q.shape[1] (qk) or out.shape[1] (pv), a multiple of W (the float lanes of a vector:
16 on AVX-512, 8 elsewhere); KW = 2 W keys. All arrays are 2-D float32 with unit column
stride (rows may be strided). Per step each tile loads one row chunk and broadcasts four
scalars, against 8 (qk) or 16 (pv) independent multiply-add chains: the loads a
multiply-add costs are a quarter to a half of decode's row kernels (dots.py), and no
horizontal sums. The caller checks shapes and bounds (KT has columns up to s0 + KW, Q and
P rows up to q0 + 4); these tiles do not.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..codegen.ir import F32, FAST, _c, _for, _i64, _llvm_fn, _load, _Rows, _splat, _store_vec, _v
from ..runtime.simd import VNNI

W = 16 if VNNI else 8  # float lanes per vector (AVX-512 / AVX2 and the portable path)
KW = 2 * W  # keys per qk tile
QT = 4  # query rows per tile
PV_VECS = 4 if VNNI else 2  # output vectors per query row per pass of pv_tile


def _qk_codegen(ctx, b, sig, args):
    KT, Q, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 4))
    s0, q0 = args[1], args[3]
    vt = _v(F32, W)
    qrows = [Q.row(b.add(q0, _i64(i))) for i in range(QT)]
    koff = b.mul(s0, _i64(4))

    def step(d, acc):
        krow = KT.row(d)
        ks = [_load(b, krow, b.add(koff, _i64(4 * W * h)), vt) for h in range(KW // W)]
        new = []
        for i in range(QT):
            qv = _splat(b, _load(b, qrows[i], b.mul(d, _i64(4)), F32), W)
            for h, k in enumerate(ks):
                new.append(b.fadd(acc[i * len(ks) + h], b.fmul(qv, k, flags=FAST), flags=FAST))
        return new

    init = [_c(vt, [0.0] * W)] * (QT * (KW // W))
    acc = _for(b, _i64(0), Q.cols, init, step)
    for i in range(QT):
        orow = out.row(b.add(q0, _i64(i)))
        for h in range(KW // W):
            _store_vec(b, orow, b.add(koff, _i64(4 * W * h)), acc[i * (KW // W) + h])
    return ctx.get_dummy_value()


def _pv_codegen(ctx, b, sig, args):
    V, P, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 4))
    m, q0 = args[1], args[3]
    vt = _v(F32, W)
    prows = [P.row(b.add(q0, _i64(i))) for i in range(QT)]
    orows = [out.row(b.add(q0, _i64(i))) for i in range(QT)]

    def chunks(c0, c1, nv):
        """Output columns [c0 * nv W, c1 * nv W) in passes of nv vectors per query row."""

        def chunk(c, st):
            base = b.mul(c, _i64(4 * W * nv))
            offs = [b.add(base, _i64(4 * W * k)) for k in range(nv)]
            acc = [_load(b, orows[i], o, vt) for i in range(QT) for o in offs]

            def row(j, acc):
                vrow = V.row(j)
                vs = [_load(b, vrow, o, vt) for o in offs]
                new = []
                for i in range(QT):
                    pv = _splat(b, _load(b, prows[i], b.mul(j, _i64(4)), F32), W)
                    for k, x in enumerate(vs):
                        new.append(b.fadd(acc[i * nv + k], b.fmul(pv, x, flags=FAST),
                                          flags=FAST))
                return new

            acc = _for(b, _i64(0), m, acc, row)
            for i in range(QT):
                for k, o in enumerate(offs):
                    _store_vec(b, orows[i], o, acc[i * nv + k])
            return st

        _for(b, c0, c1, [], chunk)

    D = out.cols
    wide = b.sdiv(D, _i64(W * PV_VECS))
    chunks(_i64(0), wide, PV_VECS)
    chunks(b.mul(wide, _i64(PV_VECS)), b.sdiv(D, _i64(W)), 1)
    return ctx.get_dummy_value()


def _check(name, arrays, ints):
    for k, a in arrays.items():
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32):
            raise TypingError(f"{name}: {k} must be a 2-D float32 array, got {a}")
    for k, a in ints.items():
        if not isinstance(a, types.Integer):
            raise TypingError(f"{name}: {k} must be an integer, got {a}")


@intrinsic
def qk_tile(typingctx, KT, s0, Q, q0, out):
    _check("qk_tile", {"KT": KT, "Q": Q, "out": out}, {"s0": s0, "q0": q0})
    return types.none(KT, types.int64, Q, types.int64, out), _qk_codegen


@intrinsic
def pv_tile(typingctx, V, m, P, q0, out):
    _check("pv_tile", {"V": V, "P": P, "out": out}, {"m": m, "q0": q0})
    return types.none(V, types.int64, P, types.int64, out), _pv_codegen


def _row_max_codegen(ctx, b, sig, args):
    A = _Rows(ctx, b, sig.args[0], args[0])
    row, n = A.row(args[1]), args[2]
    vt = _v(F32, W)
    vmax = _llvm_fn(b, f"llvm.maxnum.v{W}f32", vt, [vt, vt])
    smax = _llvm_fn(b, "llvm.maxnum.f32", F32, [F32, F32])
    nv = b.sdiv(n, _i64(W))

    def vec(k, st):
        return [b.call(vmax, [st[0], _load(b, row, b.mul(k, _i64(4 * W)), vt)])]

    lo = ir.Constant(F32, -3.4028234663852886e38)
    m = _for(b, _i64(0), nv, [_c(vt, [-3.4028234663852886e38] * W)], vec)[0]
    red = _llvm_fn(b, f"llvm.vector.reduce.fmax.v{W}f32", F32, [vt])
    best = b.call(red, [m])

    def tail(k, st):
        return [b.call(smax, [st[0], _load(b, row, b.mul(k, _i64(4)), F32)])]

    best = _for(b, b.mul(nv, _i64(W)), n, [b.call(smax, [best, lo])], tail)[0]
    return best


@intrinsic
def row_max(typingctx, A, r, n):
    _check("row_max", {"A": A}, {"r": r, "n": n})
    return types.float32(A, types.int64, types.int64), _row_max_codegen
