"""q4_k, q5_k and q6_k matrices (ggml's bytes) on super-block activations (act_quant_k.py's
ActK: int16 or int8, one scale per 256 values): the decode rows.

  mv_rows_kk(kind, w, xq, xd, xb, out, r0, r1)   out[0, r0:r1] = W[r0:r1] @ x[0]
  mv_kk(kind, w, xq, xd, xb, out)                the same over all rows, parallel in chunks

These are kquant_int.py's mv_rows_kq and mv_kq: the types' one-row tiles
(codegen/kquant_tiles.make_ktile) run codegen/kquant_k_tiles.py's code where the sums
argument is ActK's int32 xb (ActQ8's is float32 xds), so one dispatch serves both layouts.
Callers validate shapes (linear.py, step/fused.py: K % 256 == 0, xd [., K/256],
xb [., K/16]): these kernels do not check bounds.
"""

from __future__ import annotations

from .kquant_int import KQ_CODES as KK_CODES
from .kquant_int import has_kq as has_kk
from .kquant_int import mv_kq as mv_kk
from .kquant_int import mv_rows_kq as mv_rows_kk

__all__ = ["KK_CODES", "has_kk", "mv_kk", "mv_rows_kk"]
