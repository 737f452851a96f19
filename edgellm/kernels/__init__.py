"""Numba kernels.

numba_setup is imported first, so numba sees edgellm's cache directory and threading layer.
Linear algebra on stored weights: `linear.py` (validation and dispatch: linear, embedding,
ActQ8, quantize_act), built on matvec.py (decode), matmul.py (prefill), act_quant.py and
the LLVM IR intrinsics of simd.py (SIMD_PATH "vnni" or "portable") and panel.py (prefill's
packed weight panels). Attention: attention.py (prefill) and decode_step.py (the fused
decode step, with dots.py's key dot products); fastexp.py's exp32 for softmax and SwiGLU.
"""

from .. import numba_setup  # noqa: F401
