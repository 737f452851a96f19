"""Activation quantization: float32 [T, K] -> int8 blocks of 32 (llama.cpp's q8_0 rounding),
or int16 blocks of 32 (the same rounding, scale amax / 32767) where xq is int16.

Per row t and block b: xq[t, 32b:32b+32] int8 (int16), xd[t, b] the float32 scale, xs[t, b]
the sum of the block's integers, xds[t, b] = xd * xs (used by the q4_0 / q4_1 kernels).
Bit for bit quant.quantize_activations_q8 (q16): compiled without fastmath.
The row's IR is the intrinsic `quant_row` (one vector of 32 values per block).
"""

from numba import prange, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..codegen.ir import (
    F32,
    I8,
    I16,
    I32,
    _c,
    _finite_inverse,
    _for,
    _i64,
    _llvm_fn,
    _load,
    _Rows,
    _splat,
    _v,
)
from .jit import kernel

__all__ = ["quant_row", "quantize_rows", "quantize_rows_parallel"]


def _quant_row_codegen(ctx, b, sig, args):
    """Row t of X (float32 [T, K]) -> int8 (int16) blocks of 32, as quant.quantize_activations_q8
    (q16).

    d = amax / 127 (32767), inv = 1 / d (0 where not finite), q = sign(v) floor(|v| + 0.5)
    with v = x inv, all in float32: bit for bit the reference when the calling kernel is `exact`.
    """
    x, xq, xd, xs, xds = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 5))
    t = args[1]
    A = I16 if sig.args[2].dtype == types.int16 else I8
    qmax = 32767.0 if A == I16 else 127.0
    xr, qr, dr, sr, dsr = (a.row(t) for a in (x, xq, xd, xs, xds))
    v32 = _v(F32, 32)
    fabs = _llvm_fn(b, "llvm.fabs.v32f32", v32, [v32])
    floor = _llvm_fn(b, "llvm.floor.v32f32", v32, [v32])
    copysign = _llvm_fn(b, "llvm.copysign.v32f32", v32, [v32, v32])
    vmax = _llvm_fn(b, "llvm.vector.reduce.fmax.v32f32", F32, [v32])
    vadd = _llvm_fn(b, "llvm.vector.reduce.add.v32i32", I32, [_v(I32, 32)])

    def body(bi, st):
        v = _load(b, xr, b.mul(bi, _i64(128)), v32)
        amax = b.call(vmax, [b.call(fabs, [v])], fastmath=("nnan", "nsz"))  # order-free: exact
        d = b.fdiv(amax, _c(F32, qmax))
        inv = _finite_inverse(b, d)
        sv = b.fmul(v, _splat(b, inv, 32))
        r = b.call(floor, [b.fadd(b.call(fabs, [sv]), _c(v32, [0.5] * 32))])
        q = b.fptosi(b.call(copysign, [r, sv]), _v(A, 32))
        p = b.gep(qr, [b.mul(bi, _i64(4 * A.width))], inbounds=True)
        b.store(q, b.bitcast(p, q.type.as_pointer()), align=1)
        total = b.call(vadd, [b.sext(q, _v(I32, 32))])
        off = b.mul(bi, _i64(4))
        for row, val in ((dr, d), (sr, total), (dsr, b.fmul(d, b.sitofp(total, F32)))):
            p = b.gep(row, [off], inbounds=True)
            b.store(val, b.bitcast(p, val.type.as_pointer()), align=4)
        return st

    _for(b, _i64(0), b.sdiv(x.cols, _i64(32)), [], body)
    return ctx.get_dummy_value()


@intrinsic
def quant_row(typingctx, X, t, XQ, XD, XS, XDS):
    """quant_row(x, t, xq, xd, xs, xds): quantize row t of x into row t of the buffers
    (xq int8 or int16)."""
    want = ((X, (types.float32,)), (XQ, (types.int8, types.int16)), (XD, (types.float32,)),
            (XS, (types.int32,)), (XDS, (types.float32,)))
    for a, dt in want:
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype in dt):
            raise TypingError(f"quant_row: expected a 2-D {dt} array, got {a}")
    return types.none(X, types.int64, XQ, XD, XS, XDS), _quant_row_codegen


@kernel(exact=True)
def quantize_rows(x, xq, xd, xs, xds, t0, t1):
    """Quantize rows t0..t1-1 of x [T, K] (K % 32 == 0) into the same rows of the buffers."""
    for t in range(t0, t1):
        quant_row(x, t, xq, xd, xs, xds)


@kernel(parallel=True, exact=True)
def quantize_rows_parallel(x, xq, xd, xs, xds, T):
    """quantize_rows over rows 0..T-1, split between threads."""
    for t in prange(T):
        quant_row(x, t, xq, xd, xs, xds)
