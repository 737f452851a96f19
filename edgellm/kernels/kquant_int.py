"""Integer-activation kernels for q4_k, q5_k and q6_k weights (ggml's bytes) on ActQ8's int16
(default) or int8 activation blocks of 32: decode and prefill. (q5_0 and q5_1 have a
generated family: tiles.py's recipe.)

  mv_rows_kq(kind, w, xq, xd, xds, out, r0, r1)   decode: out[0, r0:r1] = W[r0:r1] @ x[0]
  mv_kq(kind, w, xq, xd, xds, out)                the same over all rows, parallel in chunks
  mm_kq(kind, w, xq, xd, xs, xds, out, T, threads)   prefill: out[:T] = x[:T] @ W.T; a chunk
                                                  of ROWS rows (in L1) meets the tokens four
                                                  at a time, rows split between threads;
                                                  q4_k, q5_k on q4_1's panels, q6_k
                                                  on its own (panel.py)
kind is the type's code (quant.TYPES[name].code, KQ_CODES); the tiles are
codegen/kquant_tiles.py's. The decode rows also take act_quant_k's super-block activations
(xds then ActK's int32 xb: kquant_kact.py). Callers validate shapes (linear.py,
step/fused.py): these kernels do not check bounds. q2_k and q3_k have kquant.py's
float-activation kernels only.
"""

from __future__ import annotations

from numba import njit, prange

from ..codegen.int8_tiles import GROUP
from ..modelfile import quant
from .family import by_kind, tile
from .jit import GLUE, kernel
from .matmul import panel_tokens, thread_count, thread_part
from .panel import (  # noqa: F401  (intrinsics, resolved by numba at compile time)
    pack_q4_k,
    pack_q5_k,
    pack_q6_k,
    pack_q6_k_wide,
    ptile_q6_k_8x1,
    ptile_q6_k_8x4,
    q6_k_wide,
)
from .panel16 import k16_rows

__all__ = ["KQ_CODES", "has_kq", "mm_kq", "mv_kq", "mv_rows_kq"]

KQ_TYPES = ("q4_k", "q5_k", "q6_k")
KQ_CODES = tuple(quant.TYPES[n].code for n in KQ_TYPES)
Q4_K, Q5_K, Q6_K = KQ_CODES
PANEL_Q4_1 = quant.TYPES["q4_1"].code  # the panels q4_k and q5_k pack into
CHUNK = 16  # decode: rows per parallel work item
ROWS = 16  # prefill's last rows (fewer than a panel's 8): weight rows per chunk



@kernel
def has_kq(kind):
    """Whether type code `kind` has these kernels."""
    return kind == Q4_K or kind == Q5_K or kind == Q6_K


def _one_row(role: str, rows: bool):
    """by_kind's case: type c's one-row tile `role` (tiles.py) on row i, or on rows i..r1-1."""
    def case(c: int):
        if rows:
            @njit(**GLUE)
            def run(w, i, xq, xd, xds, t, out, r1):
                for r in range(i, r1):
                    tile(c, role, w, 256, r, xq, xd, xds, t, out)
        else:
            @njit(**GLUE)
            def run(w, i, xq, xd, xds, t, out):
                tile(c, role, w, 256, i, xq, xd, xds, t, out)
        return run
    return case


# (kind, w, i, xq, xd, xds, t, out): the code's tile at run time, one branch a code
_tile1 = by_kind(list(KQ_CODES), _one_row("1", False))
_tile4 = by_kind(list(KQ_CODES), _one_row("4", False))
_rows1 = by_kind(list(KQ_CODES), _one_row("1", True))  # (..., r1): rows i..r1-1


@kernel
def mv_rows_kq(kind, w, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], one row at a time (a super-block row is one stream)."""
    _rows1(kind, w, r0, xq, xd, xds, 0, out, r1)


@kernel(parallel=True)
def mv_kq(kind, w, xq, xd, xds, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_kq(kind, w, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def mm_rows_kq(kind, w, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T: chunks of ROWS rows, four tokens per tile."""
    for c0 in range(r0, r1, ROWS):
        c1 = min(r1, c0 + ROWS)
        for t in range(0, T - 3, 4):
            for i in range(c0, c1):
                _tile4(kind, w, i, xq, xd, xds, t, out)
        for t in range(T - T % 4, T):
            for i in range(c0, c1):
                _tile1(kind, w, i, xq, xd, xds, t, out)


@kernel
def _pack_q4_1_panel(kind, w, i, panel, scales, g):
    """Rows i..i+7 of a q4_k / q5_k matrix as a q4_1 panel in row g."""
    if kind == Q4_K:
        pack_q4_k(w, 256, i, panel, scales, g)
    else:
        pack_q5_k(w, 256, i, panel, scales, g)


@kernel
def mm_rows_panel(kind, w, xq, xd, xs, xds, out, r0, r1, T, panel, scales):
    """out[:T, r0:r1] = x[:T] @ W[r0:r1].T: groups of 8 rows packed into a panel once
    (panel.py's pack_<type>) and met by the tokens six at a time (q6_k: four), the last
    rows through the 1x4 / 1x1 tiles. q4_k and q5_k pack into q4_1's panels
    (value d q + m per 32 values) and run on q4_1's tiles (matmul.panel_tokens); q6_k
    (d sc (q - 32), a scale per 16 values) on its own."""
    g1 = r0 + (r1 - r0) // GROUP * GROUP
    a1 = k16_rows(kind, w, xq, xd, xds, out, r0, g1, T)  # int16 on VNNI: 16-row panels
    for i in range(a1, g1, GROUP):
        if kind != Q6_K:
            _pack_q4_1_panel(kind, w, i, panel, scales, 0)
        elif q6_k_wide(xq):
            pack_q6_k_wide(w, 256, i, panel, scales, 0)
        else:
            pack_q6_k(w, 256, i, panel, scales, 0)
        if kind == Q6_K:
            for t in range(0, T - 3, 4):
                ptile_q6_k_8x4(panel, scales, 0, xq, xd, xs, xds, t, out, i)
            for t in range(T - T % 4, T):
                ptile_q6_k_8x1(panel, scales, 0, xq, xd, xs, xds, t, out, i)
            continue
        panel_tokens(PANEL_Q4_1, panel, scales, xq, xd, xs, xds, out, i, T)
    mm_rows_kq(kind, w, xq, xd, xds, out, g1, r1, T)


@kernel(parallel=True)
def mm_kq(kind, w, xq, xd, xs, xds, out, T, threads):
    nth = thread_count(w.shape[0], threads)
    for p in prange(nth):
        r0, r1, panel, scales = thread_part(w.shape[0], nth, p, xq.shape[1])
        mm_rows_panel(kind, w, xq, xd, xs, xds, out, r0, r1, T, panel, scales)
