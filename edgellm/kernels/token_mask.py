"""Token masks: a constraint's allowed tokens as a bitmask applied to logits.

The bitmask is llguidance's layout: int32 [ceil(V / 32)], bit j of word w allows token
32 * w + j. `masked_logits` copies logits [V] into out [V] with every token whose bit is 0
set to -inf, and returns the largest value kept (-inf when the mask allows nothing).
"""

import numpy as np
from numba import njit

from .. import numba_setup  # noqa: F401

OPT = dict(fastmath=False, boundscheck=False, error_model="numpy", nogil=True, cache=True)


def masked_logits(logits: np.ndarray, mask: np.ndarray, out: np.ndarray) -> float:
    """out[i] = logits[i] if mask allows i else -inf; returns max(out). Shapes checked here,
    so the kernel never reads or writes outside its arrays."""
    if logits.ndim != 1 or out.shape != logits.shape or out.dtype != np.float32:
        raise ValueError(f"logits {logits.shape} and out {out.shape} (float32) must be [V]")
    if mask.ndim != 1 or mask.dtype != np.int32 or mask.shape[0] * 32 < logits.shape[0]:
        raise ValueError(f"mask must be int32 [>= {(logits.shape[0] + 31) // 32}], "
                         f"got {mask.dtype} {mask.shape}")
    return float(_masked_logits(logits, mask, out))


@njit(**OPT)
def _masked_logits(logits, mask, out):
    n = logits.shape[0]
    best = -np.inf
    for w in range((n + 31) // 32):
        bits = np.uint32(mask[w])
        base = w * 32
        top = min(32, n - base)
        if bits == 0:
            for j in range(top):
                out[base + j] = -np.inf
            continue
        for j in range(top):
            if (bits >> np.uint32(j)) & np.uint32(1):
                v = logits[base + j]
                out[base + j] = v
                if v > best:
                    best = v
            else:
                out[base + j] = -np.inf
    return best
