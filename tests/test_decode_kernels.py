"""Decode attention's row kernels (dots.py) and the GELU-tanh gate against numpy (torch's
gelu(approximate="tanh") formula, in float64: torch is not a test dependency)."""

import numpy as np
import pytest
from numba import njit

from edgellm.kernels.activations import geglu_tanh, geglu_tanh_row
from edgellm.kernels.dots import dots16, wsum_rows


@njit(cache=False)
def _wsum(V, W, out):
    wsum_rows(V, 3, 17, W, 2, 5, out, 1)


@njit(cache=False)
def _dots(K, q, out):
    dots16(K, 2, q, 1, out, 4, np.float32(0.5))


@pytest.mark.parametrize("D", [256, 96, 64, 40, 7])
def test_wsum_rows_on_strided_rows(D):
    rng = np.random.default_rng(D)
    V = rng.standard_normal((30, 3, D + 5)).astype(np.float32)[:, 1, :D]  # a KV head's rows
    W = rng.standard_normal((4, 40)).astype(np.float32)
    out = rng.standard_normal((3, D)).astype(np.float32)
    want = out.copy()
    want[1] += W[2, 5:22] @ V[3:20]
    _wsum(V, W, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(out[[0, 2]], want[[0, 2]])  # other rows untouched


@pytest.mark.parametrize("D", [256, 64, 16])
def test_dots16_on_strided_rows(D):
    rng = np.random.default_rng(D)
    K = rng.standard_normal((20, 2, D)).astype(np.float32)[:, 1]
    q = rng.standard_normal((2, D)).astype(np.float32)
    out = np.zeros((2, 24), np.float32)
    _dots(K, q, out)
    np.testing.assert_allclose(out[1, 4:20], 0.5 * (K[2:18] @ q[1]), rtol=1e-5, atol=1e-4)
    assert not out[0].any() and not out[1, :4].any() and not out[1, 20:].any()


@pytest.mark.parametrize("D", [256, 64, 40, 7])
def test_row_kernels_read_f16_rows_as_their_float32_values_bit_for_bit(D):
    """An f16 cache's rows (uint16 bits, converted as loaded) give the float32 kernels'
    results on the decoded rows, bit for bit (the step read them through a decoded tile)."""
    rng = np.random.default_rng(D + 1)
    half = rng.standard_normal((30, 3, D + 5)).astype(np.float16)[:, 1, :D]
    bits, vals = half.view(np.uint16), half.astype(np.float32)
    W = rng.standard_normal((4, 40)).astype(np.float32)
    out = rng.standard_normal((3, D)).astype(np.float32)
    a, b = out.copy(), out.copy()
    _wsum(bits, W, a)
    _wsum(vals, W, b)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    if D % 16 == 0:
        q = rng.standard_normal((2, D)).astype(np.float32)
        a, b = np.zeros((2, 24), np.float32), np.zeros((2, 24), np.float32)
        _dots(bits, q, a)
        _dots(vals, q, b)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_geglu_tanh_matches_torchs_formula():
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((3, 200)) * 4).astype(np.float32)
    g[0, :6] = [0.0, -0.0, 1e-30, -100.0, 100.0, 1e-4]
    u = rng.standard_normal((3, 200)).astype(np.float32)
    out = np.zeros_like(g)
    geglu_tanh(g, u, out)
    x = g.astype(np.float64)  # torch: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))) * u
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    for r in range(3):  # the prefill's rows in parallel are the decode step's row kernel
        row = np.zeros(200, np.float32)
        geglu_tanh_row(g[r], u[r], row)
        np.testing.assert_array_equal(row, out[r])
