"""Matrix-matrix kernels (prefill, T > 1): out[T, N] = x[T, K] @ W[N, K].T.

Same weights, modes and conventions as matvec.py. Work is split over weight rows: a chunk
of ROWS rows stays in L1 while it meets the tokens four at a time, so each weight block
is unpacked once per 4 tokens (int8: two rows x 4 tokens per unpack and activation load;
float: one row x 4 tokens). The last T % 4 tokens go one at a time.
  mm_rows_<type>(w, block, xq, xd, xds, out, r0, r1, T)  int8, serial over rows r0..r1-1
  mm_<type>(w, block, xq, xd, xds, out, T)               int8, parallel over rows
  mmp_rows_<type>(w, block, x, out, r0, r1), mmp_<type>(w, block, x, out)   float x
The int8 kernels take T (ActQ8 buffers may hold more rows); the float ones use all of x.
Callers validate shapes first (linear.py): these kernels do not check bounds.
"""

from numba import prange

from .simd import (  # noqa: F401  (intrinsics, resolved by numba at compile time)
    GROUP,
    ftile_f16_1x1,
    ftile_f16_1x4,
    ftile_f32_1x1,
    ftile_f32_1x4,
    ftile_q4_0_1x1,
    ftile_q4_0_1x4,
    ftile_q4_1_1x1,
    ftile_q4_1_1x4,
    ftile_q8_0_1x1,
    ftile_q8_0_1x4,
    kernel,
    tile_q4_0_1x1,
    tile_q4_0_1x4,
    tile_q4_0_8x1,
    tile_q4_0_8x4,
    tile_q4_1_1x1,
    tile_q4_1_1x4,
    tile_q4_1_8x1,
    tile_q4_1_8x4,
    tile_q8_0_1x1,
    tile_q8_0_1x4,
    tile_q8_0_8x1,
    tile_q8_0_8x4,
)

ROWS = 16  # weight rows per chunk: 16 rows of 1536 q8_0 columns are 26 KB, within L1


# --- int8 activations -------------------------------------------------------------------

@kernel
def mm_rows_q8_0(w, block, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, q8_0 weights."""
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        g1 = c0 + (c1 - c0) // GROUP * GROUP  # rows c0..g1 in groups, the rest alone
        for t in range(0, T - 3, 4):
            for i in range(c0, g1, GROUP):
                tile_q8_0_8x4(w, block, i, xq, xd, xds, t, out)
            for i in range(g1, c1):
                tile_q8_0_1x4(w, block, i, xq, xd, xds, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, g1, GROUP):
                tile_q8_0_8x1(w, block, i, xq, xd, xds, t, out)
            for i in range(g1, c1):
                tile_q8_0_1x1(w, block, i, xq, xd, xds, t, out)


@kernel
def mm_rows_q4_0(w, block, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, q4_0 weights."""
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        g1 = c0 + (c1 - c0) // GROUP * GROUP  # rows c0..g1 in groups, the rest alone
        for t in range(0, T - 3, 4):
            for i in range(c0, g1, GROUP):
                tile_q4_0_8x4(w, block, i, xq, xd, xds, t, out)
            for i in range(g1, c1):
                tile_q4_0_1x4(w, block, i, xq, xd, xds, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, g1, GROUP):
                tile_q4_0_8x1(w, block, i, xq, xd, xds, t, out)
            for i in range(g1, c1):
                tile_q4_0_1x1(w, block, i, xq, xd, xds, t, out)


@kernel
def mm_rows_q4_1(w, block, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, q4_1 weights."""
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        g1 = c0 + (c1 - c0) // GROUP * GROUP  # rows c0..g1 in groups, the rest alone
        for t in range(0, T - 3, 4):
            for i in range(c0, g1, GROUP):
                tile_q4_1_8x4(w, block, i, xq, xd, xds, t, out)
            for i in range(g1, c1):
                tile_q4_1_1x4(w, block, i, xq, xd, xds, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, g1, GROUP):
                tile_q4_1_8x1(w, block, i, xq, xd, xds, t, out)
            for i in range(g1, c1):
                tile_q4_1_1x1(w, block, i, xq, xd, xds, t, out)


@kernel(parallel=True)
def mm_q8_0(w, block, xq, xd, xds, out, T):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mm_rows_q8_0(w, block, xq, xd, xds, out, c * ROWS, min(n, c * ROWS + ROWS), T)


@kernel(parallel=True)
def mm_q4_0(w, block, xq, xd, xds, out, T):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mm_rows_q4_0(w, block, xq, xd, xds, out, c * ROWS, min(n, c * ROWS + ROWS), T)


@kernel(parallel=True)
def mm_q4_1(w, block, xq, xd, xds, out, T):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mm_rows_q4_1(w, block, xq, xd, xds, out, c * ROWS, min(n, c * ROWS + ROWS), T)


# --- float activations ------------------------------------------------------------------

@kernel
def mmp_rows_q8_0(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T, q8_0 weights dequantized in registers."""
    T = x.shape[0]
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T - 3, 4):
            for i in range(c0, c1):
                ftile_q8_0_1x4(w, block, i, x, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, c1):
                ftile_q8_0_1x1(w, block, i, x, t, out)


@kernel
def mmp_rows_q4_0(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T, q4_0 weights dequantized in registers."""
    T = x.shape[0]
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T - 3, 4):
            for i in range(c0, c1):
                ftile_q4_0_1x4(w, block, i, x, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, c1):
                ftile_q4_0_1x1(w, block, i, x, t, out)


@kernel
def mmp_rows_q4_1(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T, q4_1 weights dequantized in registers."""
    T = x.shape[0]
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T - 3, 4):
            for i in range(c0, c1):
                ftile_q4_1_1x4(w, block, i, x, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, c1):
                ftile_q4_1_1x1(w, block, i, x, t, out)


@kernel
def mmp_rows_f32(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T, float32 W [N, K], any K."""
    T = x.shape[0]
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T - 3, 4):
            for i in range(c0, c1):
                ftile_f32_1x4(w, block, i, x, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, c1):
                ftile_f32_1x1(w, block, i, x, t, out)


@kernel
def mmp_rows_f16(w, block, x, out, r0, r1):
    """out[:, r0:r1] = x @ W[r0:r1].T, W the uint16 bits of float16 [N, K], any K."""
    T = x.shape[0]
    for c0 in range(r0, r1, ROWS):
        c1 = min(c0 + ROWS, r1)
        for t in range(0, T - 3, 4):
            for i in range(c0, c1):
                ftile_f16_1x4(w, block, i, x, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, c1):
                ftile_f16_1x1(w, block, i, x, t, out)


@kernel(parallel=True)
def mmp_q8_0(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mmp_rows_q8_0(w, block, x, out, c * ROWS, min(n, c * ROWS + ROWS))


@kernel(parallel=True)
def mmp_q4_0(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mmp_rows_q4_0(w, block, x, out, c * ROWS, min(n, c * ROWS + ROWS))


@kernel(parallel=True)
def mmp_q4_1(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mmp_rows_q4_1(w, block, x, out, c * ROWS, min(n, c * ROWS + ROWS))


@kernel(parallel=True)
def mmp_f32(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mmp_rows_f32(w, block, x, out, c * ROWS, min(n, c * ROWS + ROWS))


@kernel(parallel=True)
def mmp_f16(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + ROWS - 1) // ROWS):
        mmp_rows_f16(w, block, x, out, c * ROWS, min(n, c * ROWS + ROWS))
