"""Activations for the K-quant matrices (q4_k, q5_k, q6_k): float32 [T, K] -> int8 or int16
super-blocks of 256 (q8_K's layout), next to act_quant.py's blocks of 32 (ActQ8).

Per row t and super-block s (K % 256 == 0): xq[t, 256s:256s+256] int8 (int16), xd[t, s] the
float32 scale (amax / 127, or / 32767 where xq is int16), xb[t, 16j] .. the int32 sum of each
16 integers (the K-quants' minima and q6_k's offset of 32 are taken off with them).
One scale per 256 values lets a K-quant tile multiply its 6-bit (8-bit) scales in integers and
sum a super-block's 8 blocks in one integer vector (codegen/kquant_k_tiles.py), where ActQ8's
scale per 32 makes it scale and reduce each block apart. The rounding is act_quant's (and
llama.cpp's q8_K's): q = sign(v) floor(|v| + 0.5), v = x / d, in float32.
Bit for bit quant_k.quantize_activations_k: compiled without fastmath. With int16 on
AVX-512 VNNI (SPLIT) each super-block's 512 bytes of xq hold its 256 low bytes q & 255, then
its 256 high bytes q >> 8 (values(xq) reads the integers back, pack(q) writes them). Off
VNNI on x86 (DEINT) each block of 32 holds its 16 even-numbered values, then its 16 odd
ones: the tiles read a K-quant's code bytes as 16-bit words, whose low and high bytes are a
block's even and odd values (kquant_k_tiles.py), instead of widening each byte on the
shuffle port.

    ActK(T_max, K, dtype)         the buffers (xq, xd, xb) and T, the rows last filled
    quantize_k(x, act)            x [T, K] into act's first T rows (validated)
    quant_row_k(x, t, xq, xd, xb) the intrinsic: row t, as the decode step calls it
    values(xq), pack(q)           the stored layout to integers [T, K] and back (numpy)
"""

from __future__ import annotations

import numpy as np
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
    _pick,
    _Rows,
    _splat,
    _v,
)
from ..codegen.kquant_k_tiles import DEINT
from ..runtime.simd import VNNI
from .act_buffers import Act
from .jit import kernel

__all__ = ["DEINT", "SPLIT", "ActK", "QK", "pack", "quant_row_k", "quantize_k",
           "quantize_rows_k", "quantize_rows_k_parallel", "values"]

QK = 256  # values per super-block (the K-quants' and q8_K's)
SUM = 16  # values per sum in xb
PARALLEL_T = 16  # quantize with the parallel kernel from this many rows
# int16 on AVX-512 VNNI: a super-block as its low bytes, then its high bytes, which the
# tiles multiply by the codes in vpdpbusd (u8 x s8: kquant_k_tiles.py)
SPLIT = VNNI
# DEINT (off VNNI on x86): each block of 32 as its even values, then its odd ones
EVEN_ODD = [*range(0, 32, 2), *range(1, 32, 2)]


class ActK(Act):
    """Preallocated super-block activations for up to T_max rows of K features
    (K % 256 == 0): xq int8 or int16 [T_max, K], xd float32 [T_max, K/256], xb int32
    [T_max, K/16]; `T` the rows the last quantize_k filled."""

    __slots__ = ("xb",)
    BLOCK = QK

    def __init__(self, T_max: int, K: int, dtype=np.int16):
        super().__init__(T_max, K, dtype)
        self.xb = np.zeros((self.T_max, self.K // SUM), np.int32)


def _quant_row_k_codegen(ctx, b, sig, args):
    """Row t of X (float32 [T, K]) -> super-blocks of 256 in row t of xq, xd, xb."""
    x, xq, xd, xb = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4))
    t = args[1]
    A = I16 if sig.args[2].dtype == types.int16 else I8
    qmax = 32767.0 if A == I16 else 127.0
    split = SPLIT and A == I16
    xr, qr, dr, br = (a.row(t) for a in (x, xq, xd, xb))
    v32 = _v(F32, 32)
    fabs = _llvm_fn(b, "llvm.fabs.v32f32", v32, [v32])
    floor = _llvm_fn(b, "llvm.floor.v32f32", v32, [v32])
    copysign = _llvm_fn(b, "llvm.copysign.v32f32", v32, [v32, v32])
    vmax = _llvm_fn(b, "llvm.vector.reduce.fmax.v32f32", F32, [v32])
    maxnum = _llvm_fn(b, "llvm.maxnum.v32f32", v32, [v32, v32])
    vadd = _llvm_fn(b, "llvm.vector.reduce.add.v16i32", I32, [_v(I32, 16)])

    def body(s, st):
        vs = [_load(b, xr, b.add(b.mul(s, _i64(4 * QK)), _i64(128 * g)), v32) for g in range(8)]
        m = b.call(fabs, [vs[0]])
        for v in vs[1:]:  # max is order-free: exact whatever the order
            m = b.call(maxnum, [m, b.call(fabs, [v])])
        amax = b.call(vmax, [m], fastmath=("nnan", "nsz"))
        d = b.fdiv(amax, _c(F32, qmax))
        inv = _finite_inverse(b, d)
        iv = _splat(b, inv, 32)
        for g, v in enumerate(vs):
            sv = b.fmul(v, iv)
            r = b.call(floor, [b.fadd(b.call(fabs, [sv]), _c(v32, [0.5] * 32))])
            q = b.fptosi(b.call(copysign, [r, sv]), _v(A, 32))
            base = b.mul(s, _i64(QK * A.width // 8))
            if split:  # the low bytes, then the high ones (SPLIT)
                parts = ((0, b.trunc(q, _v(I8, 32))),
                         (QK, b.trunc(b.ashr(q, _c(_v(I16, 32), [8] * 32)), _v(I8, 32))))
            elif DEINT:  # even values, then odd ones; the sums below are of q in order
                parts = ((0, _pick(b, q, EVEN_ODD)),)
            else:
                parts = ((0, q),)
            for at, v in parts:
                p = b.gep(qr, [b.add(base, _i64(at + 32 * g * v.type.element.width // 8))],
                          inbounds=True)
                b.store(v, b.bitcast(p, v.type.as_pointer()), align=1)
            w = b.sext(q, _v(I32, 32))
            for h in range(2):
                total = b.call(vadd, [_pick(b, w, range(16 * h, 16 * h + 16))])
                p = b.gep(br, [b.add(b.mul(s, _i64(4 * QK // SUM)), _i64(4 * (2 * g + h)))],
                          inbounds=True)
                b.store(total, b.bitcast(p, I32.as_pointer()), align=4)
        p = b.gep(dr, [b.mul(s, _i64(4))], inbounds=True)
        b.store(d, b.bitcast(p, F32.as_pointer()), align=4)
        return st

    _for(b, _i64(0), b.sdiv(x.cols, _i64(QK)), [], body)
    return ctx.get_dummy_value()


@intrinsic
def quant_row_k(typingctx, X, t, XQ, XD, XB):
    """quant_row_k(x, t, xq, xd, xb): quantize row t of x into row t of the buffers."""
    want = ((X, (types.float32,)), (XQ, (types.int8, types.int16)), (XD, (types.float32,)),
            (XB, (types.int32,)))
    for a, dt in want:
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype in dt):
            raise TypingError(f"quant_row_k: expected a 2-D {dt} array, got {a}")
    return types.none(X, types.int64, XQ, XD, XB), _quant_row_k_codegen


@kernel(exact=True)
def quantize_rows_k(x, xq, xd, xb, t0, t1):
    """Quantize rows t0..t1-1 of x [T, K] (K % 256 == 0) into the same rows of the buffers."""
    for t in range(t0, t1):
        quant_row_k(x, t, xq, xd, xb)


@kernel(parallel=True, exact=True)
def quantize_rows_k_parallel(x, xq, xd, xb, T):
    """quantize_rows_k over rows 0..T-1, split between threads."""
    for t in prange(T):
        quant_row_k(x, t, xq, xd, xb)


def values(xq: np.ndarray) -> np.ndarray:
    """The integers of activations xq [T, K] as the quantizer stored them (SPLIT: int16
    super-blocks as bytes; DEINT: blocks as even, then odd values), int16 or int8 [T, K]."""
    if DEINT:
        return xq.reshape(len(xq), -1, 2, 16).transpose(0, 1, 3, 2).reshape(xq.shape)
    if not (SPLIT and xq.dtype == np.int16):
        return xq
    b = xq.view(np.uint8).reshape(len(xq), -1, 2, QK)
    hi, lo = b[:, :, 1].view(np.int8).astype(np.int16), b[:, :, 0].astype(np.int16)
    return ((hi << 8) | lo).reshape(xq.shape)


def pack(q: np.ndarray) -> np.ndarray:
    """int16 or int8 integers q [T, K] in the layout the tiles read (values' inverse)."""
    if DEINT:
        return np.ascontiguousarray(q.reshape(len(q), -1, 16, 2).transpose(0, 1, 3, 2)
                                    ).reshape(q.shape)
    if not (SPLIT and q.dtype == np.int16):
        return q.copy()
    u = q.view(np.uint16).reshape(len(q), -1, QK)
    b = np.stack([(u & 255).astype(np.uint8), (u >> 8).astype(np.uint8)], axis=2)
    return b.reshape(len(q), -1).view(np.int16)


def quantize_k(x: np.ndarray, act: ActK, threads: int = 1) -> ActK:
    """Quantize x float32 [T, K] (C-contiguous) into the first T rows of `act`; returns act."""
    if not isinstance(act, ActK):
        raise ValueError(f"act must be an ActK, got {type(act).__name__}")
    T = act.rows_of(x)
    if T >= PARALLEL_T and threads > 1:
        quantize_rows_k_parallel(x, act.xq, act.xd, act.xb, T)
    elif T:
        quantize_rows_k(x, act.xq, act.xd, act.xb, 0, T)
    act.T = T
    return act
