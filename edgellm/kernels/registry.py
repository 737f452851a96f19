"""Which kernels run each stored matrix type, by type code.

The block-size types' kernels are generated, one family a type (KERNELS[code][role]: the
matvec.py, matmul.py and panel_gemm.py factories over the tiles tiles.py's recipe gives it);
these tables name them by role for linear.py:

  INT8[type]   Int8Kernels: matvec on int8 activation blocks (ActQ8), serial over rows and
               parallel, and the matmul on packed panels; for quant.INT8_TYPES
  BATCH[type]  BatchKernels: matvec's row groups over a few rows at once (matvec.py's mvb:
               beams), serial and parallel; for the types with the batched step's tiles
  FLOAT[type]  FloatKernels: the same on float32 activations, the embedding lookup and
               the encoders' panel GEMM (panel_gemm.py); for quant.MATRIX_TYPES
X16[type]    the kernels of its matrices in the x16 layout (x16.py), by role: mv_rows, mv,
             mm, mvp_rows, mvp, mmp, embed (for layout.X16_TYPES); q4_k's and q6_k's
             (x16_k.py) take super-block activations (ActK) as mv_rows_sb, mv_sb, mm_sb,
             mm_rows_sb instead, and prefill's int16 blocks as mm_panels
quant.TYPES says which types have which kernels; this says which functions they are, and
checks at import that the two agree. linear.py dispatches through it, the fused step
through family.kern (KERNELS, by code).
q5_0, q5_1 and the K-quants share kquant.py's float-activation kernels, which take the
type's code first: their entries are kernels of one type each (`_k_float`: `<role>_<type>`,
the `block` argument unused, the type fixes it) passing the code as a constant, so that a
model compiles its own types' code only (family.by_kind); q4_k, q5_k and q6_k also have
kquant_int.py's integer-activation ones (`_k_int`, likewise), q5_0 and q5_1 a generated
family's (tiles.py's recipe).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..modelfile import layout as layouts
from ..modelfile import quant
from . import kquant, kquant_int
from .family import KERNELS
from .jit import kernel
from .matmul import make_matmul
from .matvec import make_matvec
from .panel_gemm import make_gemm
from .tiles import RECIPES
from .x16 import make_x16
from .x16_k import make_x16_k

__all__ = ["BATCH", "FLOAT", "INT8", "KERNELS", "X16", "BatchKernels", "FloatKernels",
           "Int8Kernels"]


class Int8Kernels(NamedTuple):
    rows: Any  # (w, block, xq, xd, xds, out, r0, r1): serial, output rows r0..r1-1
    parallel: Any  # (w, block, xq, xd, xds, out)
    matmul: Any  # (w, block, xq, xd, xs, xds, out, T, threads)


class BatchKernels(NamedTuple):
    rows: Any  # (w, block, xq, xd, xds, out, r0, r1, T): serial, output rows r0..r1-1
    parallel: Any  # (w, block, xq, xd, xds, out, T)


class FloatKernels(NamedTuple):
    rows: Any  # (w, block, x, out, r0, r1)
    parallel: Any  # (w, block, x, out)
    matmul: Any  # (w, block, x, out)
    embed: Any  # (w, block, ids, out)
    gemm: Any  # (w, block, x, out): the encoders' matmul on dequantized panels


INT8: dict[str, Int8Kernels] = {}
BATCH: dict[str, BatchKernels] = {}
FLOAT: dict[str, FloatKernels] = {}
for _name, _recipe in RECIPES.items():
    _code = quant.TYPES[_name].code
    _k = KERNELS[_code] = {**make_matvec(_code), **make_matmul(_code)}
    if _recipe.floats:
        _k["gemm"] = make_gemm(_code)
        FLOAT[_name] = FloatKernels(_k["mvp_rows"], _k["mvp"], _k["mmp"], _k["embed"],
                                    _k["gemm"])
    if "mv_rows" in _k:
        INT8[_name] = Int8Kernels(_k["mv_rows"], _k["mv"], _k["mm"])
    if "mvb" in _k:
        BATCH[_name] = BatchKernels(_k["mvb_rows"], _k["mvb"])


def _by_type(name: str, role: str):
    """@kernel for a by-type entry of the K-quant kernels: cached under its own name
    (`<role>_<type>`), so that each type's entry has its own index in the kernel cache."""
    def wrap(f):
        f.__name__ = f.__qualname__ = f"{role}_{name}"
        return kernel(f)
    return wrap


def _k_float(name: str) -> FloatKernels:
    """kquant.py's kernels for type `name`, one entry a type: each calls the kernel with the
    type's code as a constant, so that numba compiles that type's code only (family.by_kind:
    a literal kind), not all seven."""
    code = quant.TYPES[name].code

    @_by_type(name, "mvp_rows_k")
    def rows(w, block, x, out, r0, r1):
        kquant.mvp_rows_k(code, w, x, out, r0, r1)

    @_by_type(name, "mvp_k")
    def parallel(w, block, x, out):
        kquant.mvp_k(code, w, x, out)

    @_by_type(name, "gemm_k")
    def gemm(w, block, x, out):
        kquant.gemm_k(code, w, x, out)

    @_by_type(name, "embed_k")
    def embed(w, block, ids, out):
        kquant.embed_k(code, w, ids, out)
    return FloatKernels(rows, parallel, gemm, embed, gemm)


def _k_int(name: str) -> Int8Kernels:
    """kquant_int.py's kernels for type `name`, one entry a type (as _k_float's)."""
    code = quant.TYPES[name].code

    @_by_type(name, "mv_rows_kq")
    def rows(w, block, xq, xd, xds, out, r0, r1):
        kquant_int.mv_rows_kq(code, w, xq, xd, xds, out, r0, r1)

    @_by_type(name, "mv_kq")
    def parallel(w, block, xq, xd, xds, out):
        kquant_int.mv_kq(code, w, xq, xd, xds, out)

    @_by_type(name, "mm_kq")
    def matmul(w, block, xq, xd, xs, xds, out, T, threads):
        kquant_int.mm_kq(code, w, xq, xd, xs, xds, out, T, threads)
    return Int8Kernels(rows, parallel, matmul)


for _name in quant.K_TYPES:  # kquant.py's and kquant_int.py's kernels, by code
    if _name not in FLOAT:
        FLOAT[_name] = _k_float(_name)
    if quant.TYPES[_name].int8_kernels and _name not in INT8:
        INT8[_name] = _k_int(_name)

# the x16 layout's kernels (x16.py: modelfile/layout.py), beside the type's own, by role
# "x16_<role>" in KERNELS; X16[type] the same by role for linear.py
X16: dict[str, dict] = {}
for _name in layouts.X16_TYPES:
    _k = ({"x16_" + role: f for role, f in make_x16_k(_name).items()}
          if _name in layouts.X16_SB else make_x16(quant.TYPES[_name].code))
    KERNELS.setdefault(quant.TYPES[_name].code, {}).update(_k)
    X16[_name] = {role[4:]: f for role, f in _k.items()}

if set(INT8) != set(quant.INT8_TYPES) or set(FLOAT) != set(quant.MATRIX_TYPES):
    raise ImportError(f"kernels/registry.py disagrees with quant.TYPES: int8 kernels for "
                      f"{sorted(INT8)} (table: {sorted(quant.INT8_TYPES)}), float kernels "
                      f"for {sorted(FLOAT)} (table: {sorted(quant.MATRIX_TYPES)})")
