"""Activation quantization: float32 [T, K] -> int8 blocks of 32 (llama.cpp's q8_0 rounding).

Per row t and block b: xq[t, 32b:32b+32] int8, xd[t, b] the float32 scale, xs[t, b] the sum
of the block's int8 values, xds[t, b] = xd * xs (used by the q4_0 / q4_1 kernels).
Bit for bit quant.quantize_activations_q8: these kernels are compiled without fastmath.
"""

from numba import prange

from .simd import kernel, quant_row


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
