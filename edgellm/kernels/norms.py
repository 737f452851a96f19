"""RMSNorm kernels."""

import numpy as np
from numba import njit

from ..runtime import (  # noqa: F401  (cache dir and threading layer before numba compiles)
    numba_setup,
)

OPT = dict(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, cache=True)


@njit(**OPT)
def rmsnorm(x, w, eps, unit_offset, out):
    """out[T,D] = x[T,D] / rms(x) * (w[D] + unit_offset); x and out may be the same array."""
    T, D = x.shape
    for t in range(T):
        ss = np.float32(0.0)
        for i in range(D):
            ss += x[t, i] * x[t, i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(D) + np.float32(eps))
        for i in range(D):
            out[t, i] = x[t, i] * inv * (w[i] + np.float32(unit_offset))


@njit(**OPT)
def rmsnorm_heads(x, w, eps, unit_offset):
    """In place over the last axis of x[T,H,Dh] with weight w[Dh] (per-head q/k norm)."""
    T, H, Dh = x.shape
    for t in range(T):
        for h in range(H):
            ss = np.float32(0.0)
            for i in range(Dh):
                ss += x[t, h, i] * x[t, h, i]
            inv = np.float32(1.0) / np.sqrt(ss / np.float32(Dh) + np.float32(eps))
            for i in range(Dh):
                x[t, h, i] = x[t, h, i] * inv * (w[i] + np.float32(unit_offset))


@njit(**OPT)
def add_inplace(x, y):
    """x[T,D] += y[T,D] (residual connection)."""
    T, D = x.shape
    for t in range(T):
        for i in range(D):
            x[t, i] += y[t, i]

