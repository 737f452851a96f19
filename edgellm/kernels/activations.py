"""Gated MLP activations: SwiGLU and GELU-tanh gating."""

import numpy as np
from numba import prange

from .simd import kernel


@kernel(parallel=True)
def swiglu(gate, up, out):
    """out[T,F] = silu(gate) * up, rows in parallel."""
    T, F = gate.shape
    for t in prange(T):
        for i in range(F):
            g = gate[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]


@kernel
def geglu_tanh(gate, up, out):
    """out[T,F] = gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh)."""
    T, F = gate.shape
    c = np.float32(0.7978845608028654)  # sqrt(2/pi)
    for t in range(T):
        for i in range(F):
            g = gate[t, i]
            inner = c * (g + np.float32(0.044715) * g * g * g)
            out[t, i] = np.float32(0.5) * g * (np.float32(1.0) + np.tanh(inner)) * up[t, i]
