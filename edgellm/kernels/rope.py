"""Rotary position embeddings, Hugging Face's half-split layout (rotate_half)."""

import numpy as np
from numba import njit

from ..runtime import numba_setup  # noqa: F401

OPT = dict(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, cache=True)


def rope_tables(positions: np.ndarray, inv_freq: np.ndarray, scaling: float = 1.0):
    """cos, sin float32 [T, Dh/2] for integer positions [T] (computed in float64)."""
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return ((np.cos(ang) * scaling).astype(np.float32),
            (np.sin(ang) * scaling).astype(np.float32))


@njit(**OPT)
def apply_rope(x, cos, sin):
    """In place: x[T,H,Dh] rotated by the angles of cos/sin [T, Dh/2].

    Pairs element i with i + Dh/2: (a, b) -> (a cos - b sin, b cos + a sin).
    """
    T, H, Dh = x.shape
    half = Dh // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                a = x[t, h, i]
                b = x[t, h, i + half]
                c = cos[t, i]
                s = sin[t, i]
                x[t, h, i] = a * c - b * s
                x[t, h, i + half] = b * c + a * s
