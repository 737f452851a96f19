"""How a KV cache stores K and V (`kv_type`), one row per (slot, KV head) of Dh values:

  f32   float32 [Dh]
  f16   the bits of float16 [Dh] (uint16; numba has no float16)
  q8_0  ggml's q8_0 blocks [Dh/32 * 34] (uint8: f16 scale d, then 32 int8 q; value d * q)

Only numpy here: the memory plan and `edgellm info` use it without the kernels.
"""

from __future__ import annotations

import numpy as np

from ..errors import CacheTypeError

KV_TYPES = ("f32", "f16", "q8_0")
# half f32's bytes, which attention reads every token; the float model's greedy answers kept
# (docs/measurements.md, "The default KV cache type")
DEFAULT_KV_TYPE = "f16"
KV_DTYPE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.uint16), "q8_0": np.dtype(np.uint8)}


def kv_row_width(kv_type: str, head_dim: int) -> int:
    """Stored elements of one (slot, head) row."""
    return head_dim // 32 * 34 if kv_type == "q8_0" else head_dim


def kv_row_bytes(kv_type: str, head_dim: int) -> int:
    return kv_row_width(kv_type, head_dim) * KV_DTYPE[kv_type].itemsize


def check_kv_type(kv_type, head_dim: int) -> str:
    """kv_type, checked: one of KV_TYPES, and q8_0 only where head_dim is a multiple of 32."""
    if kv_type not in KV_TYPES:
        raise CacheTypeError(f"kv_type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
    if kv_type == "q8_0" and head_dim % 32:
        raise CacheTypeError(f"kv_type q8_0 needs a head_dim that is a multiple of 32 "
                             f"(this model's is {head_dim}): use f16")
    return kv_type
