"""Token masks: a constraint's allowed tokens as a bitmask applied to logits.

The bitmask is llguidance's layout: int32 [ceil(V / 32)], bit j of word w allows token
32 * w + j. `mask_logits` sets, in place, every logit whose bit is 0 to -inf. Words with
every bit set (most of them inside a JSON string) are only read, never written, so the
cost is a pass over the V / 32 words plus the forbidden lanes.
"""

import numpy as np
from numba import njit

from ..runtime import numba_setup  # noqa: F401

OPT = dict(fastmath=False, boundscheck=False, error_model="numpy", nogil=True, cache=True)


def mask_logits(logits: np.ndarray, mask: np.ndarray) -> None:
    """logits float32 [V] (in place): -inf where mask int32 [ceil(V / 32)] has a 0 bit.
    Shapes and types are checked here, so the kernel stays inside its arrays."""
    if logits.ndim != 1 or logits.dtype != np.float32 or not logits.flags.writeable:
        raise ValueError(f"logits must be a writeable float32 [V], got {logits.dtype} "
                         f"{logits.shape}")
    if mask.ndim != 1 or mask.dtype != np.int32 or mask.shape[0] * 32 < logits.shape[0]:
        raise ValueError(f"mask must be int32 [>= {(logits.shape[0] + 31) // 32}], "
                         f"got {mask.dtype} {mask.shape}")
    _mask_logits(logits, mask)


@njit(**OPT)
def _mask_logits(logits, mask):
    n = logits.shape[0]
    full = n // 32
    ninf = np.float32(-np.inf)
    for w in range(full):
        bits = np.uint32(mask[w])
        if bits == np.uint32(0xFFFFFFFF):
            continue
        base = w * 32
        for j in range(32):  # a select per lane: LLVM vectorizes it
            logits[base + j] = logits[base + j] if (bits >> np.uint32(j)) & np.uint32(1) \
                else ninf
    base = full * 32
    if base < n:
        bits = np.uint32(mask[full])
        for j in range(n - base):
            logits[base + j] = logits[base + j] if (bits >> np.uint32(j)) & np.uint32(1) \
                else ninf
