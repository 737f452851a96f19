"""Matrix-matrix kernels (prefill, T > 1): out[T, N] = x[T, K] @ W[N, K].T.

Same weights, modes and conventions as matvec.py.
int8 activations: each group of 8 weight rows is packed once into a panel (panel.py) that
then meets all T tokens, six at a time (of the last T % 6, four, then one at a time;
six keep a higher rate than four on AVX-512, q8_0 most): the packing is
paid once per matrix product, and the tiles need no horizontal sums. Where the CPU has
AMX (simd.AMX) and the activations are int16, two groups at a time meet 32 tokens at a
time on AMX tiles instead (amx.py), when T >= 32 (a remainder of fewer than 24 tokens on
the panel tiles). Threads take
contiguous ranges of row groups, each with its own panel. Rows past the last whole group
(N % 8) use tiles.py's one-row tiles.
float activations: a chunk of ROWS rows stays in L1 while it meets the tokens four at a
time (one row x 4 tokens per weight unpack).
Each type's kernels are made by `make_matmul(code)` from its tiles (tiles.py):
  mm_rows(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales)
                                                         int8, serial over rows r0..r1-1
  mm(w, block, xq, xd, xs, xds, out, T, threads)         int8, rows split between threads
                                                         (numba.get_num_threads())
  mmp_rows(w, block, x, out, r0, r1), mmp(w, block, x, out)   float x
The int8 kernels take T (ActQ8 buffers may hold more rows); the float ones use all of x.
Callers validate shapes first (linear.py): these kernels do not check bounds.
"""

import numpy as np
from numba import literally, prange

from ..codegen.int8_tiles import GROUP
from ..modelfile import quant
from .amx import BX_BLOCK, MIN_TOKENS, amx_panels
from .amx import ROWS as AMX_ROWS
from .family import kern, name_of, tile
from .jit import kernel
from .matvec import named, parallel_rows
from .panel import SCALES_BLOCK, WIDE_BLOCK
from .tiles import RECIPES

ROWS = 16  # float path: weight rows per chunk (16 rows of 1536 q8_0 columns: 26 KB, in L1)


# --- int8 activations -------------------------------------------------------------------

@kernel
def panel_scratch(K):
    """A thread's panels and scales for two groups of 8 rows of K columns (panel.py; the
    AMX tiles take two groups at once, the others row 0)."""
    return (np.empty((2, K // 32 * WIDE_BLOCK), np.uint8),  # (q6_k's wide panels)
            np.empty((2, K // 32 * SCALES_BLOCK), np.float32))


AMX_TAIL = 24  # a last pass of 32 tokens on AMX costs about as much as 24 on the panel
# tiles (measured: a shorter tail goes to the panel tiles)


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


@kernel
def thread_count(n, threads):
    """Threads a matrix of n rows takes: at most one a group of 8."""
    return max(1, min(threads, (n + GROUP - 1) // GROUP))


@kernel
def thread_part(n, nth, p, K):
    """Thread p of nth's rows [r0, r1) (thread_rows) and its panels (panel_scratch)."""
    r0, r1 = thread_rows(n, nth, p)
    panel, scales = panel_scratch(K)
    return r0, r1, panel, scales


@kernel
def panel_rows(kind, panel, scales, g, xq, xd, xs, xds, out, i, t0, T):
    """out[t0:T, i:i+8] from the group packed in panel row g, a panel of type code `kind`
    (a constant): the tokens six at a time, the last (T - t0) % 6 four and one at a time."""
    literally(kind)
    n = T - t0
    for t in range(t0, T - 5, 6):
        tile(kind, "p6", panel, scales, g, xq, xd, xs, xds, t, out, i)
    for t in range(T - n % 6, T - 3, 4):
        tile(kind, "p4", panel, scales, g, xq, xd, xs, xds, t, out, i)
    for t in range(T - n % 6 + n % 6 // 4 * 4, T):
        tile(kind, "p1", panel, scales, g, xq, xd, xs, xds, t, out, i)


@kernel
def panel_tokens(kind, panel, scales, xq, xd, xs, xds, out, i, T):
    """out[:T, i:i+8] from the group packed in panel row 0 (panel_rows)."""
    literally(kind)
    panel_rows(kind, panel, scales, 0, xq, xd, xs, xds, out, i, 0, T)


@kernel
def amx_tail(kind, panel, scales, xq, xd, xs, xds, out, i, ta, T):
    """Tokens ta..T-1 of the two groups in panel rows 0 and 1 (rows i..i+15) on the panel
    tiles: what amx_rows leaves off the AMX passes."""
    literally(kind)
    for g in range(2):
        panel_rows(kind, panel, scales, g, xq, xd, xs, xds, out, i + g * GROUP, ta, T)


def make_matmul(code: int) -> dict:
    """Type `code`'s matrix-matrix kernels: {"mm_rows", "mm" (int8 types), "mmp_rows",
    "mmp" (types with float tiles)}, each a kernel closing over the code alone (family.py:
    caching)."""
    name = name_of(code)
    recipe = RECIPES[name]
    P = quant.TYPES[recipe.panel or name].code  # the panel tiles its packed groups run on

    @kernel
    @named(f"mm_rows_{name}")
    def mm_rows(w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales):
        """out[:T, r0:r1] = x[:T] @ W[r0:r1].T: groups of 8 rows packed (two at a time on
        AMX), the last rows one at a time."""
        g1 = r0 + (r1 - r0) // GROUP * GROUP
        a1, ta, bx = amx_rows(xq, T, r0, g1)
        for i in range(r0, a1, AMX_ROWS):
            tile(code, "pack", w, block, i, panel, scales, 0)
            tile(code, "pack", w, block, i + GROUP, panel, scales, 1)
            tile(P, "amx", panel, scales, xq, xd, xs, xds, out, bx, i, ta)
            amx_tail(P, panel, scales, xq, xd, xs, xds, out, i, ta, T)
        for i in range(a1, g1, GROUP):
            tile(code, "pack", w, block, i, panel, scales, 0)
            panel_tokens(P, panel, scales, xq, xd, xs, xds, out, i, T)
        for t in range(0, T - 3, 4):
            for i in range(g1, r1):
                tile(code, "4", w, block, i, xq, xd, xds, t, out)
        for t in range(T - T % 4, T):
            for i in range(g1, r1):
                tile(code, "1", w, block, i, xq, xd, xds, t, out)

    @kernel(parallel=True)
    @named(f"mm_{name}")
    def mm(w, block, xq, xd, xs, xds, out, T, threads):
        nth = thread_count(w.shape[0], threads)
        for p in prange(nth):
            r0, r1, panel, scales = thread_part(w.shape[0], nth, p, xq.shape[1])
            kern(code, "mm_rows", w, block, xq, xd, xs, xds, out, r0, r1, T, panel, scales)

    @kernel
    @named(f"mmp_rows_{name}")
    def mmp_rows(w, block, x, out, r0, r1):
        """out[:, r0:r1] = x @ W[r0:r1].T, weights dequantized in registers."""
        T = x.shape[0]
        for c0 in range(r0, r1, ROWS):
            c1 = min(c0 + ROWS, r1)
            for t in range(0, T - 3, 4):
                for i in range(c0, c1):
                    tile(code, "f4", w, block, i, x, t, out)
            for t in range(T - T % 4, T):
                for i in range(c0, c1):
                    tile(code, "f1", w, block, i, x, t, out)

    mmp = parallel_rows(code, "mmp_rows", ROWS, f"mmp_{name}")

    kernels = dict(mmp_rows=mmp_rows, mmp=mmp) if recipe.floats else {}
    if recipe.group:
        kernels.update(mm_rows=mm_rows, mm=mm)
    return kernels
