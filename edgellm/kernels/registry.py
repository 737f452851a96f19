"""Which kernels run each stored matrix type: one entry per type, each function named.

  INT8[type]   Int8Kernels: matvec on int8 activation blocks (ActQ8), serial over rows and
               parallel, and the matmul on packed panels; for quant.INT8_TYPES
  FLOAT[type]  FloatKernels: the same on float32 activations, the embedding lookup and
               the encoders' panel GEMM (panel_gemm.py); for quant.MATRIX_TYPES
quant.TYPES says which types have which kernels; this says which functions they are, and
checks at import that the two agree. linear.py dispatches through it.
q5_0 and the K-quants share kquant.py's float-activation kernels, which take the type's code
first: their entries bind it (`_k_float`; the `block` argument is unused, the type fixes it);
q4_k, q5_k and q6_k also have kquant_int.py's integer-activation ones (`_k_int`, likewise).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import quant
from . import kquant, kquant_int, matmul, matvec, panel_gemm

__all__ = ["FLOAT", "INT8", "FloatKernels", "Int8Kernels"]


class Int8Kernels(NamedTuple):
    rows: Any  # (w, block, xq, xd, xds, out, r0, r1): serial, output rows r0..r1-1
    parallel: Any  # (w, block, xq, xd, xds, out)
    matmul: Any  # (w, block, xq, xd, xs, xds, out, T, threads)


class FloatKernels(NamedTuple):
    rows: Any  # (w, block, x, out, r0, r1)
    parallel: Any  # (w, block, x, out)
    matmul: Any  # (w, block, x, out)
    embed: Any  # (w, block, ids, out)
    gemm: Any  # (w, block, x, out): the encoders' matmul on dequantized panels


INT8 = {
    "q8_0": Int8Kernels(matvec.mv_rows_q8_0, matvec.mv_q8_0, matmul.mm_q8_0),
    "q4_0": Int8Kernels(matvec.mv_rows_q4_0, matvec.mv_q4_0, matmul.mm_q4_0),
    "q4_1": Int8Kernels(matvec.mv_rows_q4_1, matvec.mv_q4_1, matmul.mm_q4_1),
}
FLOAT = {
    "f32": FloatKernels(matvec.mvp_rows_f32, matvec.mvp_f32, matmul.mmp_f32, matvec.embed_f32,
                        panel_gemm.gemm_f32),
    "f16": FloatKernels(matvec.mvp_rows_f16, matvec.mvp_f16, matmul.mmp_f16, matvec.embed_f16,
                        panel_gemm.gemm_f16),
    "q8_0": FloatKernels(matvec.mvp_rows_q8_0, matvec.mvp_q8_0, matmul.mmp_q8_0,
                         matvec.embed_q8_0, panel_gemm.gemm_q8_0),
    "q4_0": FloatKernels(matvec.mvp_rows_q4_0, matvec.mvp_q4_0, matmul.mmp_q4_0,
                         matvec.embed_q4_0, panel_gemm.gemm_q4_0),
    "q4_1": FloatKernels(matvec.mvp_rows_q4_1, matvec.mvp_q4_1, matmul.mmp_q4_1,
                         matvec.embed_q4_1, panel_gemm.gemm_q4_1),
}



def _k_float(code: int) -> FloatKernels:
    gemm = lambda w, block, x, out: kquant.gemm_k(code, w, x, out)  # noqa: E731
    return FloatKernels(
        lambda w, block, x, out, r0, r1: kquant.mvp_rows_k(code, w, x, out, r0, r1),
        lambda w, block, x, out: kquant.mvp_k(code, w, x, out), gemm,
        lambda w, block, ids, out: kquant.embed_k(code, w, ids, out), gemm)


def _k_int(code: int) -> Int8Kernels:
    return Int8Kernels(
        lambda w, block, xq, xd, xds, out, r0, r1: kquant_int.mv_rows_kq(code, w, xq, xd, xds,
                                                                         out, r0, r1),
        lambda w, block, xq, xd, xds, out: kquant_int.mv_kq(code, w, xq, xd, xds, out),
        lambda w, block, xq, xd, xs, xds, out, T, threads: kquant_int.mm_kq(
            code, w, xq, xd, xs, xds, out, T, threads))


for _name in quant.K_TYPES:
    FLOAT[_name] = _k_float(quant.TYPES[_name].code)
    if quant.TYPES[_name].int8_kernels:
        INT8[_name] = _k_int(quant.TYPES[_name].code)

if set(INT8) != set(quant.INT8_TYPES) or set(FLOAT) != set(quant.MATRIX_TYPES):
    raise ImportError(f"kernels/registry.py disagrees with quant.TYPES: int8 kernels for "
                      f"{sorted(INT8)} (table: {sorted(quant.INT8_TYPES)}), float kernels "
                      f"for {sorted(FLOAT)} (table: {sorted(quant.MATRIX_TYPES)})")
