"""exp for float32 that gives libm's results and vectorizes: `exp32(x)`.

numba lowers np.exp(float32) to a call of the C library's expf, one element at a time.
SwiGLU and the softmax call it for every element: millions of times in a prefill, a
visible share of its time.

exp32 is glibc's expf algorithm (ARM's optimized-routines, glibc >= 2.28) written so that
LLVM can vectorize it: exp(x) = 2^(k/32) 2^(r/32) with k = round(x 32/ln2), 2^(k/32) from a
32-entry table and 2^(r/32) from a degree-3 polynomial, all in float64, rounded to float32
once. The multiply-adds are llvm.fmuladd: fused where the CPU has FMA, as glibc's FMA
variant is. On glibc (x86-64 with FMA, and aarch64) every float32 input gives the same
bits as libm's expf, NaN payloads aside: tests/test_fastexp.py checks this, so swapping it
in changes no result. Elsewhere it is within an ulp of the true value.

exp32 is inlined by numba (inline="always") into its callers, which must be compiled
without fastmath (the rounding steps must stay as written): `exp_shift` here and
activations.swiglu_row. Inlined, it vectorizes with its caller's loop whatever numba's
cache holds (a cached function is called, not inlined, by functions compiled later).
Callers needing a sum of exps sum exp_shift's output in their own (fastmath) loop.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import kernel

N = 32
# tab[i] = bits(2^(i/N)) - (i << 47): bits(2^(k/N)) = tab[k % N] + (k << 47) for |k| < 150 N
TAB = np.array([
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
], dtype=np.int64)
INVLN2N = float.fromhex("0x1.71547652b82fep+0") * N
C0 = float.fromhex("0x1.c6af84b912394p-5") / N / N / N
C1 = float.fromhex("0x1.ebfce50fac4f3p-3") / N / N
C2 = float.fromhex("0x1.62e42ff0c52d6p-1") / N
LO, HI = np.float32(-104.0), np.float32(89.0)  # beyond: 0 and inf, as the formula gives


@intrinsic
def _as_f64(typingctx, bits):
    """The int64's bits as a float64."""
    def codegen(ctx, b, sig, args):
        return b.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def _fmuladd(typingctx, a, x, c):
    """a * x + c, fused where the target has FMA (llvm.fmuladd)."""
    def codegen(ctx, b, sig, args):
        d = ir.DoubleType()
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(d, [d, d, d]),
                                            "llvm.fmuladd.f64")
        return b.call(fn, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@njit(fastmath=False, boundscheck=False, error_model="numpy", nogil=True, inline="always")
def exp32(x):
    """exp(x) for a float32 x, as float32 (libm's bits on glibc)."""
    xd = np.float64(min(max(x, LO), HI))
    kd = np.rint(INVLN2N * xd)
    k = np.int64(kd)
    r = _fmuladd(INVLN2N, xd, -kd)  # x 32/ln2 - k, the product unrounded
    s = _as_f64(TAB[k & (N - 1)] + (k << 47))
    y = _fmuladd(_fmuladd(C0, r, C1), r * r, _fmuladd(C2, r, 1.0)) * s
    return x if x != x else np.float32(y)


MASKED = np.float32(-1e30)  # a score a query does not see (finite: fastmath kernels)
# the least x whose exp32(x) is a normal float32 (>= 2^-126); below it, a subnormal or 0
NORMAL_FROM = np.float32(-87.33654)


@kernel(exact=True)
def exp_shift(x, n, m):
    """x[:n] = exp(x[:n] - m), 0 where x is MASKED (a softmax's numerators) and where the
    exp would be subnormal (x - m < NORMAL_FROM). Such a numerator adds nothing that
    survives rounding to a softmax whose largest numerator is 1, but every operation with
    a subnormal costs x86 a microcode assist, and a real model's scores spread over more
    than 87, so they are common (benchmarks/batch_profile.py shows attention's time with
    and without them)."""
    for s in range(n):
        v = x[s]
        d = v - m
        x[s] = exp32(d) if v > MASKED and d >= NORMAL_FROM else np.float32(0.0)
