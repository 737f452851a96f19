"""Gated MLP activations: SwiGLU and GELU-tanh gating."""

import numpy as np
from numba import prange

from .fastexp import exp32
from .jit import kernel


@kernel(exact=True)
def swiglu_row(gate, up, out):
    """out[:] = silu(gate) * up for 1-D rows: IEEE operations in their written order (no
    fastmath), so the vectorized loop rounds exactly as a scalar one; exp32 is libm's exp."""
    for i in range(gate.shape[0]):
        g = gate[i]
        out[i] = g / (np.float32(1.0) + exp32(-g)) * up[i]


@kernel(parallel=True)
def swiglu(gate, up, out):
    """out[T,F] = silu(gate) * up, rows in parallel."""
    T = gate.shape[0]
    for t in prange(T):
        swiglu_row(gate[t], up[t], out[t])


@kernel(exact=True)
def geglu_tanh_row(gate, up, out):
    """out[:] = gelu_tanh(gate) * up for 1-D rows (Gemma's gelu_pytorch_tanh).

    0.5 g (1 + tanh(u)) = g sigmoid(2u) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3):
    the sigmoid form with exp32 vectorizes (np.tanh is libm's tanhf, one element at a time,
    a visible share of a Gemma 3 token) and has no cancellation near u = 0. IEEE
    operations in their written order (no fastmath), as swiglu_row."""
    c = np.float32(-2.0 * 0.7978845608028654)  # -2 sqrt(2/pi)
    for i in range(gate.shape[0]):
        g = gate[i]
        u = c * (g + np.float32(0.044715) * g * g * g)
        out[i] = g / (np.float32(1.0) + exp32(u)) * up[i]


@kernel(parallel=True)
def geglu_tanh(gate, up, out):
    """out[T,F] = gelu_tanh(gate) * up, rows in parallel (a prefill chunk's rows: worth
    splitting between the threads)."""
    T = gate.shape[0]
    for t in prange(T):
        geglu_tanh_row(gate[t], up[t], out[t])
