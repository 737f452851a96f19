"""The quantized models' encoder attention (kernels/whisper_attention.py) against numpy's
float softmax attention, and the vectorized row maximum its softmax and encoder.py's use."""

import numpy as np
import pytest
from numba import njit

from edgellm.kernels.encoder import row_max
from edgellm.kernels.whisper_attention import quantized_attention


def reference(q, k, v, heads, scale):
    T, D = q.shape
    Dh = D // heads
    qh, kh, vh = (a.reshape(T, heads, Dh).transpose(1, 0, 2).astype(np.float64)
                  for a in (q, k, v))
    s = qh @ kh.transpose(0, 2, 1) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(1, 0, 2).reshape(T, D)


@pytest.mark.parametrize("T", [1, 37, 600])  # 600 > CHUNK: queries in two passes
@pytest.mark.parametrize("act, tol", [(np.int16, 0.015), (np.int8, 0.025)])
def test_quantized_attention_is_float_attention_within_rounding(T, act, tol):
    rng = np.random.default_rng(T)
    heads, Dh = 3, 64
    q, k, v = (rng.standard_normal((T, heads * Dh), np.float32) for _ in range(3))
    q *= 2  # peaked rows, as trained attention has: the softmax's shift matters
    out = np.full_like(q, np.nan)
    quantized_attention(q, k, v, heads, 1 / 8, out, act)
    want = reference(q, k, v, heads, 1 / 8)
    assert np.abs(out - want).max() < tol * np.abs(want).max()


def test_quantized_attention_refuses_heads_not_in_blocks_of_32():
    x = np.zeros((4, 48), np.float32)
    with pytest.raises(ValueError, match="3 heads"):
        quantized_attention(x, x, x, 3, 0.25, np.zeros_like(x))


@njit
def _row_max(row, n):
    return row_max(row, n)


def test_row_max_is_the_maximum_of_every_length():
    row = np.random.default_rng(0).standard_normal(1504).astype(np.float32)
    row[1499] = 9.0  # the last of 1,500: in the scalar tail
    for n in list(range(0, 70)) + [1499, 1500]:
        want = row[:n].max() if n else np.float32(-3.0e38)
        assert _row_max(row, n) == want, n

