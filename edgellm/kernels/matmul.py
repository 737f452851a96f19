"""Matrix-matrix kernels (prefill, T > 1): out[T, N] = x[T, K] @ W[N, K].T.

Same weights, modes and argument conventions as matvec.py; the int8 kernels take T (the
ActQ8 buffers may hold more rows), the float ones use all rows of x. Each weight block is
unpacked once per group of 4 tokens; the last T % 4 tokens go one at a time.
  mm_rows_<type>(..., r0, r1[, T])  serial over weight rows r0..r1-1
  mm_<type>(...)                    parallel over weight rows
Callers validate shapes first (linear.py): these kernels do not check bounds.
"""

from numba import prange

from .simd import (  # noqa: F401  (the intrinsics the kernels below call)
    ftile_f16_b0_1x1,
    ftile_f16_b0_1x4,
    ftile_f32_b0_1x1,
    ftile_f32_b0_1x4,
    ftile_q4_0_b32_1x1,
    ftile_q4_0_b32_1x4,
    ftile_q4_0_b64_1x1,
    ftile_q4_0_b64_1x4,
    ftile_q4_0_b128_1x1,
    ftile_q4_0_b128_1x4,
    ftile_q4_1_b32_1x1,
    ftile_q4_1_b32_1x4,
    ftile_q4_1_b64_1x1,
    ftile_q4_1_b64_1x4,
    ftile_q4_1_b128_1x1,
    ftile_q4_1_b128_1x4,
    ftile_q8_0_b32_1x1,
    ftile_q8_0_b32_1x4,
    ftile_q8_0_b64_1x1,
    ftile_q8_0_b64_1x4,
    ftile_q8_0_b128_1x1,
    ftile_q8_0_b128_1x4,
    kernel,
    tile_q4_0_b32_1x1,
    tile_q4_0_b32_1x4,
    tile_q4_0_b32_2x1,
    tile_q4_0_b32_2x4,
    tile_q4_0_b64_1x1,
    tile_q4_0_b64_1x4,
    tile_q4_0_b128_1x1,
    tile_q4_0_b128_1x4,
    tile_q4_1_b32_1x1,
    tile_q4_1_b32_1x4,
    tile_q4_1_b32_2x1,
    tile_q4_1_b32_2x4,
    tile_q4_1_b64_1x1,
    tile_q4_1_b64_1x4,
    tile_q4_1_b128_1x1,
    tile_q4_1_b128_1x4,
    tile_q8_0_b32_1x1,
    tile_q8_0_b32_1x4,
    tile_q8_0_b32_2x1,
    tile_q8_0_b32_2x4,
    tile_q8_0_b64_1x1,
    tile_q8_0_b64_1x4,
    tile_q8_0_b128_1x1,
    tile_q8_0_b128_1x4,
)

ROWS = 16  # weight rows per chunk: 16 rows of 1536 q8_0 columns are 26 KB, within L1
CHUNK = ROWS  # rows per parallel work item


@kernel
def mm_rows_q8_0(w, block, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T: q8_0 weights, int8 activations.

    Weight rows go in chunks of ROWS (they stay in L1) and each chunk meets the tokens four
    at a time: a weight block is unpacked once per pair of rows and dotted with 4 tokens.
    """
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        if block == 32:
            for t in range(0, T4, 4):
                i = c0
                while i + 1 < c1:
                    tile_q8_0_b32_2x4(w, i, xq, xd, xds, t, out)
                    i += 2
                if i < c1:
                    tile_q8_0_b32_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                i = c0
                while i + 1 < c1:
                    tile_q8_0_b32_2x1(w, i, xq, xd, xds, t, out)
                    i += 2
                if i < c1:
                    tile_q8_0_b32_1x1(w, i, xq, xd, xds, t, out)
        elif block == 64:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    tile_q8_0_b64_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    tile_q8_0_b64_1x1(w, i, xq, xd, xds, t, out)
        else:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    tile_q8_0_b128_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    tile_q8_0_b128_1x1(w, i, xq, xd, xds, t, out)


@kernel(parallel=True)
def mm_q8_0(w, block, xq, xd, xds, out, T):
    """Parallel mm_rows_q8_0: chunks of CHUNK weight rows, an equal run of chunks per thread."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mm_rows_q8_0(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK), T)


@kernel
def mm_rows_q4_0(w, block, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T: q4_0 weights, int8 activations.

    Weight rows go in chunks of ROWS (they stay in L1) and each chunk meets the tokens four
    at a time: a weight block is unpacked once per pair of rows and dotted with 4 tokens.
    """
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        if block == 32:
            for t in range(0, T4, 4):
                i = c0
                while i + 1 < c1:
                    tile_q4_0_b32_2x4(w, i, xq, xd, xds, t, out)
                    i += 2
                if i < c1:
                    tile_q4_0_b32_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                i = c0
                while i + 1 < c1:
                    tile_q4_0_b32_2x1(w, i, xq, xd, xds, t, out)
                    i += 2
                if i < c1:
                    tile_q4_0_b32_1x1(w, i, xq, xd, xds, t, out)
        elif block == 64:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    tile_q4_0_b64_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    tile_q4_0_b64_1x1(w, i, xq, xd, xds, t, out)
        else:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    tile_q4_0_b128_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    tile_q4_0_b128_1x1(w, i, xq, xd, xds, t, out)


@kernel(parallel=True)
def mm_q4_0(w, block, xq, xd, xds, out, T):
    """Parallel mm_rows_q4_0: chunks of CHUNK weight rows, an equal run of chunks per thread."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mm_rows_q4_0(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK), T)


@kernel
def mm_rows_q4_1(w, block, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T: q4_1 weights, int8 activations.

    Weight rows go in chunks of ROWS (they stay in L1) and each chunk meets the tokens four
    at a time: a weight block is unpacked once per pair of rows and dotted with 4 tokens.
    """
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        if block == 32:
            for t in range(0, T4, 4):
                i = c0
                while i + 1 < c1:
                    tile_q4_1_b32_2x4(w, i, xq, xd, xds, t, out)
                    i += 2
                if i < c1:
                    tile_q4_1_b32_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                i = c0
                while i + 1 < c1:
                    tile_q4_1_b32_2x1(w, i, xq, xd, xds, t, out)
                    i += 2
                if i < c1:
                    tile_q4_1_b32_1x1(w, i, xq, xd, xds, t, out)
        elif block == 64:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    tile_q4_1_b64_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    tile_q4_1_b64_1x1(w, i, xq, xd, xds, t, out)
        else:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    tile_q4_1_b128_1x4(w, i, xq, xd, xds, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    tile_q4_1_b128_1x1(w, i, xq, xd, xds, t, out)


@kernel(parallel=True)
def mm_q4_1(w, block, xq, xd, xds, out, T):
    """Parallel mm_rows_q4_1: chunks of CHUNK weight rows, an equal run of chunks per thread."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mm_rows_q4_1(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK), T)


@kernel
def mmp_rows_q8_0(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T: q8_0 weights dequantized in registers, float x."""
    T = x.shape[0]
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        if block == 32:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q8_0_b32_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q8_0_b32_1x1(w, i, x, t, out)
        elif block == 64:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q8_0_b64_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q8_0_b64_1x1(w, i, x, t, out)
        else:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q8_0_b128_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q8_0_b128_1x1(w, i, x, t, out)


@kernel(parallel=True)
def mmp_q8_0(w, block, x, out):
    """Parallel mmp_rows_q8_0."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mmp_rows_q8_0(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def mmp_rows_q4_0(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T: q4_0 weights dequantized in registers, float x."""
    T = x.shape[0]
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        if block == 32:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q4_0_b32_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q4_0_b32_1x1(w, i, x, t, out)
        elif block == 64:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q4_0_b64_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q4_0_b64_1x1(w, i, x, t, out)
        else:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q4_0_b128_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q4_0_b128_1x1(w, i, x, t, out)


@kernel(parallel=True)
def mmp_q4_0(w, block, x, out):
    """Parallel mmp_rows_q4_0."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mmp_rows_q4_0(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def mmp_rows_q4_1(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T: q4_1 weights dequantized in registers, float x."""
    T = x.shape[0]
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        if block == 32:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q4_1_b32_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q4_1_b32_1x1(w, i, x, t, out)
        elif block == 64:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q4_1_b64_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q4_1_b64_1x1(w, i, x, t, out)
        else:
            for t in range(0, T4, 4):
                for i in range(c0, c1):
                    ftile_q4_1_b128_1x4(w, i, x, t, out)
            for t in range(T4, T):
                for i in range(c0, c1):
                    ftile_q4_1_b128_1x1(w, i, x, t, out)


@kernel(parallel=True)
def mmp_q4_1(w, block, x, out):
    """Parallel mmp_rows_q4_1."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mmp_rows_q4_1(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def mmp_rows_f32(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T: W float32 [N, K], any K (`block` unused)."""
    T = x.shape[0]
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T4, 4):
            for i in range(c0, c1):
                ftile_f32_b0_1x4(w, i, x, t, out)
        for t in range(T4, T):
            for i in range(c0, c1):
                ftile_f32_b0_1x1(w, i, x, t, out)


@kernel(parallel=True)
def mmp_f32(w, block, x, out):
    """Parallel mmp_rows_f32."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mmp_rows_f32(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def mmp_rows_f16(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T: W uint16: the f16 bits [N, K], any K (`block` unused)."""
    T = x.shape[0]
    T4 = T - T % 4
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T4, 4):
            for i in range(c0, c1):
                ftile_f16_b0_1x4(w, i, x, t, out)
        for t in range(T4, T):
            for i in range(c0, c1):
                ftile_f16_b0_1x1(w, i, x, t, out)


@kernel(parallel=True)
def mmp_f16(w, block, x, out):
    """Parallel mmp_rows_f16."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mmp_rows_f16(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

