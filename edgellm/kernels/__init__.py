"""Numba kernels.

numba_setup is imported first, so numba sees edgellm's cache directory and threading layer.
Linear algebra on stored weights: `linear.py` (validation and dispatch: linear, embedding,
ActQ8, quantize_act) through registry.py (each quant.TYPES type's kernels, by type code),
whose families matvec.py (decode), matmul.py (prefill) and panel_gemm.py generate from a
type's tiles, and act_quant.py. The tiles are LLVM IR intrinsics, made for each type from
its recipe in tiles.py by the code generators codegen_int8.py, codegen_float.py,
codegen_kquant.py, panel.py (prefill's packed weight panels), amx.py and interleave.py,
which build on ir.py's helpers; kernels find them by type code (family.py). simd.py picks
the SIMD path for this CPU ("vnni" or "portable"); jit.py has the `@kernel` decorator and
the cache tag. Attention: attention.py (prefill) and
decode_step.py (the fused decode step, with dots.py's key dot products); fastexp.py's
exp32 for softmax and SwiGLU. No module here reads the environment: the process's
settings come from numba_setup.py.
"""

from ..runtime import numba_setup  # noqa: F401
