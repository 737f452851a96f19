"""q4_k, q5_k and q6_k matrices (ggml's bytes) on super-block activations (act_quant_k.py's
ActK: int16 or int8, one scale per 256 values): the decode rows.

  mv_rows_kk(kind, w, xq, xd, xb, out, r0, r1)   out[0, r0:r1] = W[r0:r1] @ x[0]
  mv_kk(kind, w, xq, xd, xb, out)                the same over all rows, parallel in chunks

kind is the type's code (KK_CODES); the tiles are codegen/kquant_k_tiles.py's, registered
here as the types' "kk1" / "kk4" tiles (family.TILES). Callers validate shapes (linear.py,
step/fused.py: K % 256 == 0, xd [., K/256], xb [., K/16]): these kernels do not check bounds.
"""

from __future__ import annotations

from numba import njit, prange

from ..codegen.kquant_k_tiles import make_kktile
from ..modelfile import quant
from . import tiles  # noqa: F401  (fills TILES before the K types' entries get theirs)
from .family import TILES, by_kind, tile
from .jit import GLUE, kernel

__all__ = ["KK_CODES", "has_kk", "mv_kk", "mv_rows_kk"]

KK_TYPES = ("q4_k", "q5_k", "q6_k")
KK_CODES = tuple(quant.TYPES[n].code for n in KK_TYPES)
Q4_K, Q5_K, Q6_K = KK_CODES
CHUNK = 16  # rows per parallel work item

for _name, _code in zip(KK_TYPES, KK_CODES):
    TILES[_code]["kk1"] = make_kktile(_name, 1)
    TILES[_code]["kk4"] = make_kktile(_name, 4)


@kernel
def has_kk(kind):
    """Whether type code `kind` has these kernels."""
    return kind == Q4_K or kind == Q5_K or kind == Q6_K


def _rows(c: int):
    """by_kind's case: type c's one-row tile on rows i..r1-1."""
    @njit(**GLUE)
    def run(w, i, xq, xd, xb, t, out, r1):
        for r in range(i, r1):
            tile(c, "kk1", w, 256, r, xq, xd, xb, t, out)
    return run


_rows1 = by_kind(list(KK_CODES), _rows)  # (kind, w, i, xq, xd, xb, t, out, r1)


@kernel
def mv_rows_kk(kind, w, xq, xd, xb, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], one row at a time (a super-block row is one stream)."""
    _rows1(kind, w, r0, xq, xd, xb, 0, out, r1)


@kernel(parallel=True)
def mv_kk(kind, w, xq, xd, xb, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_kk(kind, w, xq, xd, xb, out, c * CHUNK, min(n, c * CHUNK + CHUNK))
