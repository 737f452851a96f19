"""Matrix-matrix kernels (prefill, T > 1): out[T, N] = x[T, K] @ W[N, K].T.

Same weights, modes and conventions as matvec.py.
int8 activations: each group of 8 weight rows is packed once into a panel (panel.py) that
then meets all T tokens, six at a time (of the last T % 6, four, then one at a time;
six keep ~1.45x (q8_0) and ~1.15x (q4_1) the rate of four on AVX-512): the packing is
paid once per matrix product, and the tiles need no horizontal sums. Where the CPU has
AMX (simd.AMX) and the activations are int16, two groups at a time meet 32 tokens at a
time on AMX tiles instead (amx.py), when T >= 32 (a remainder of fewer than 24 tokens on
the panel tiles). Threads take
contiguous ranges of row groups, each with its own panel. Rows past the last whole group
(N % 8) use tiles.py's one-row tiles.
float activations: a chunk of ROWS rows stays in L1 while it meets the tokens four at a
time (one row x 4 tokens per weight unpack).
  mm_rows_<type>(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales)
                                                         int8, serial over rows r0..r1-1
  mm_<type>(w, block, xq, xd, xs, xds, out, T, threads)  int8, rows split between threads
                                                         (numba.get_num_threads())
  mmp_rows_<type>(w, block, x, out, r0, r1), mmp_<type>(w, block, x, out)   float x
The int8 kernels take T (ActQ8 buffers may hold more rows); the float ones use all of x.
Callers validate shapes first (linear.py): these kernels do not check bounds.
"""

import numpy as np
from numba import prange

from .amx import (  # noqa: F401  (intrinsics, resolved by numba at compile time)
    BX_BLOCK,
    MIN_TOKENS,
    amx_panels,
    amx_tokens_q4_0,
    amx_tokens_q4_1,
    amx_tokens_q8_0,
)
from .amx import (
    ROWS as AMX_ROWS,
)
from .codegen_int8 import GROUP
from .jit import kernel
from .panel import (  # noqa: F401  (intrinsics, resolved by numba at compile time)
    SCALES_BLOCK,
    WIDE_BLOCK,
    pack_q4_0,
    pack_q4_1,
    pack_q8_0,
    ptile_q4_0_8x1,
    ptile_q4_0_8x4,
    ptile_q4_0_8x6,
    ptile_q4_1_8x1,
    ptile_q4_1_8x4,
    ptile_q4_1_8x6,
    ptile_q8_0_8x1,
    ptile_q8_0_8x4,
    ptile_q8_0_8x6,
)
from .tiles import (  # noqa: F401  (intrinsics, resolved by numba at compile time)
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
    tile_q4_0_1x1,
    tile_q4_0_1x4,
    tile_q4_1_1x1,
    tile_q4_1_1x4,
    tile_q8_0_1x1,
    tile_q8_0_1x4,
)

ROWS = 16  # float path: weight rows per chunk (16 rows of 1536 q8_0 columns: 26 KB, in L1)


# --- int8 activations -------------------------------------------------------------------

@kernel
def panel_scratch(K):
    """A thread's panels and scales for two groups of 8 rows of K columns (panel.py; the
    AMX tiles take two groups at once, the others row 0)."""
    return (np.empty((2, K // 32 * WIDE_BLOCK), np.uint8),  # (q6_k's wide panels)
            np.empty((2, K // 32 * SCALES_BLOCK), np.float32))


AMX_TAIL = 24  # a last pass of 32 tokens on AMX costs about as much as 24 on the panel
# tiles (1536x576, 1 thread: 64 tokens 451-454 us on AMX, 40 tokens 484-516 on AMX with the
# last pass overlapping, 391-402 on the panel tiles)


@kernel
def amx_rows(xq, T, r0, g1):
    """(a1, ta, bx): rows r0..a1-1 (whole groups of 16) meet tokens 0..ta-1 on the AMX
    tiles and the rest (amx_tail) on the panel tiles; none when the panels do not meet xq
    on AMX or T < MIN_TOKENS. The passes take 32 tokens, the last one ending at ta (it
    overlaps the one before when ta % 32 != 0, which it is only when that remainder is at
    least AMX_TAIL). bx: the scratch amx.py expands a block's B tiles into."""
    if amx_panels(xq) and T >= MIN_TOKENS:
        r = T % MIN_TOKENS
        ta = T if r == 0 or r >= AMX_TAIL else T - r
        return (r0 + (g1 - r0) // AMX_ROWS * AMX_ROWS, ta,
                np.empty((1, xq.shape[1] // 32 * BX_BLOCK), np.uint8))
    return r0, 0, np.empty((1, 0), np.uint8)


@kernel
def thread_rows(n, nth, p):
    """Rows [r0, r1) of thread p of nth: contiguous, whole groups of 8 but the last."""
    groups = (n + GROUP - 1) // GROUP
    return min(n, p * groups // nth * GROUP), min(n, (p + 1) * groups // nth * GROUP)


PANEL_Q8_0, PANEL_Q4_0, PANEL_Q4_1 = 0, 1, 2  # panel_tokens' tile types


@kernel
def panel_rows(kind, panel, scales, g, xq, xd, xs, xds, out, i, t0, T):
    """out[t0:T, i:i+8] from the group packed in panel row g (a PANEL_<type> panel): the
    tokens six at a time, the last (T - t0) % 6 four and one at a time."""
    n = T - t0
    for t in range(t0, T - 5, 6):
        if kind == PANEL_Q8_0:
            ptile_q8_0_8x6(panel, scales, g, xq, xd, xs, xds, t, out, i)
        elif kind == PANEL_Q4_0:
            ptile_q4_0_8x6(panel, scales, g, xq, xd, xs, xds, t, out, i)
        else:
            ptile_q4_1_8x6(panel, scales, g, xq, xd, xs, xds, t, out, i)
    for t in range(T - n % 6, T - 3, 4):
        if kind == PANEL_Q8_0:
            ptile_q8_0_8x4(panel, scales, g, xq, xd, xs, xds, t, out, i)
        elif kind == PANEL_Q4_0:
            ptile_q4_0_8x4(panel, scales, g, xq, xd, xs, xds, t, out, i)
        else:
            ptile_q4_1_8x4(panel, scales, g, xq, xd, xs, xds, t, out, i)
    for t in range(T - n % 6 + n % 6 // 4 * 4, T):
        if kind == PANEL_Q8_0:
            ptile_q8_0_8x1(panel, scales, g, xq, xd, xs, xds, t, out, i)
        elif kind == PANEL_Q4_0:
            ptile_q4_0_8x1(panel, scales, g, xq, xd, xs, xds, t, out, i)
        else:
            ptile_q4_1_8x1(panel, scales, g, xq, xd, xs, xds, t, out, i)


@kernel
def panel_tokens(kind, panel, scales, xq, xd, xs, xds, out, i, T):
    """out[:T, i:i+8] from the group packed in panel row 0 (panel_rows)."""
    panel_rows(kind, panel, scales, 0, xq, xd, xs, xds, out, i, 0, T)


@kernel
def amx_tail(kind, panel, scales, xq, xd, xs, xds, out, i, ta, T):
    """Tokens ta..T-1 of the two groups in panel rows 0 and 1 (rows i..i+15) on the panel
    tiles: what amx_rows leaves off the AMX passes."""
    for g in range(2):
        panel_rows(kind, panel, scales, g, xq, xd, xs, xds, out, i + g * GROUP, ta, T)


@kernel
def mm_rows_q8_0(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, q8_0 weights."""
    g1 = r0 + (r1 - r0) // GROUP * GROUP
    a1, ta, bx = amx_rows(xq, T, r0, g1)
    for i in range(r0, a1, AMX_ROWS):
        pack_q8_0(w, block, i, panel, scales, 0)
        pack_q8_0(w, block, i + GROUP, panel, scales, 1)
        amx_tokens_q8_0(panel, scales, xq, xd, xs, xds, out, bx, i, ta)
        amx_tail(PANEL_Q8_0, panel, scales, xq, xd, xs, xds, out, i, ta, T)
    for i in range(a1, g1, GROUP):
        pack_q8_0(w, block, i, panel, scales, 0)
        panel_tokens(PANEL_Q8_0, panel, scales, xq, xd, xs, xds, out, i, T)
    for t in range(0, T - 3, 4):
        for i in range(g1, r1):
            tile_q8_0_1x4(w, block, i, xq, xd, xds, t, out)
    for t in range(T - T % 4, T):
        for i in range(g1, r1):
            tile_q8_0_1x1(w, block, i, xq, xd, xds, t, out)


@kernel
def mm_rows_q4_0(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, q4_0 weights."""
    g1 = r0 + (r1 - r0) // GROUP * GROUP
    a1, ta, bx = amx_rows(xq, T, r0, g1)
    for i in range(r0, a1, AMX_ROWS):
        pack_q4_0(w, block, i, panel, scales, 0)
        pack_q4_0(w, block, i + GROUP, panel, scales, 1)
        amx_tokens_q4_0(panel, scales, xq, xd, xs, xds, out, bx, i, ta)
        amx_tail(PANEL_Q4_0, panel, scales, xq, xd, xs, xds, out, i, ta, T)
    for i in range(a1, g1, GROUP):
        pack_q4_0(w, block, i, panel, scales, 0)
        panel_tokens(PANEL_Q4_0, panel, scales, xq, xd, xs, xds, out, i, T)
    for t in range(0, T - 3, 4):
        for i in range(g1, r1):
            tile_q4_0_1x4(w, block, i, xq, xd, xds, t, out)
    for t in range(T - T % 4, T):
        for i in range(g1, r1):
            tile_q4_0_1x1(w, block, i, xq, xd, xds, t, out)


@kernel
def mm_rows_q4_1(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, q4_1 weights."""
    g1 = r0 + (r1 - r0) // GROUP * GROUP
    a1, ta, bx = amx_rows(xq, T, r0, g1)
    for i in range(r0, a1, AMX_ROWS):
        pack_q4_1(w, block, i, panel, scales, 0)
        pack_q4_1(w, block, i + GROUP, panel, scales, 1)
        amx_tokens_q4_1(panel, scales, xq, xd, xs, xds, out, bx, i, ta)
        amx_tail(PANEL_Q4_1, panel, scales, xq, xd, xs, xds, out, i, ta, T)
    for i in range(a1, g1, GROUP):
        pack_q4_1(w, block, i, panel, scales, 0)
        panel_tokens(PANEL_Q4_1, panel, scales, xq, xd, xs, xds, out, i, T)
    for t in range(0, T - 3, 4):
        for i in range(g1, r1):
            tile_q4_1_1x4(w, block, i, xq, xd, xds, t, out)
    for t in range(T - T % 4, T):
        for i in range(g1, r1):
            tile_q4_1_1x1(w, block, i, xq, xd, xds, t, out)


@kernel(parallel=True)
def mm_q8_0(w, block, xq, xd, xs, xds, out, T, threads):
    n = w.shape[0]
    nth = max(1, min(threads, (n + GROUP - 1) // GROUP))
    for p in prange(nth):
        r0, r1 = thread_rows(n, nth, p)
        panel, scales = panel_scratch(xq.shape[1])
        mm_rows_q8_0(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales)


@kernel(parallel=True)
def mm_q4_0(w, block, xq, xd, xs, xds, out, T, threads):
    n = w.shape[0]
    nth = max(1, min(threads, (n + GROUP - 1) // GROUP))
    for p in prange(nth):
        r0, r1 = thread_rows(n, nth, p)
        panel, scales = panel_scratch(xq.shape[1])
        mm_rows_q4_0(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales)


@kernel(parallel=True)
def mm_q4_1(w, block, xq, xd, xs, xds, out, T, threads):
    n = w.shape[0]
    nth = max(1, min(threads, (n + GROUP - 1) // GROUP))
    for p in prange(nth):
        r0, r1 = thread_rows(n, nth, p)
        panel, scales = panel_scratch(xq.shape[1])
        mm_rows_q4_1(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales)


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
