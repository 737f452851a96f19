"""Prefill attention (kernels/attention.attention, float32 cache) against numpy: causal
grouped-query attention over the cache plus the chunk, with empty slots, sliding windows,
soft-capping, head sizes that are and are not whole vectors, and key counts around the
blocks the scores are computed in; and the tiles (attn_tiles.py) on their own."""

import numpy as np
import pytest
from conftest import attention_inputs
from numba import njit

from edgellm.kernels.attention import attention
from edgellm.kernels.attn_tiles import KW, QT, W, pv_tile, qk_tile, row_max


def _reference(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap):
    T, Hq, Dh = q.shape
    G = Hq // k_new.shape[1]
    keys = np.concatenate([k_cache, k_new]).astype(np.float64)
    vals = np.concatenate([v_cache, v_new]).astype(np.float64)
    kpos = np.concatenate([cache_pos, q_pos])
    out = np.zeros((T, Hq, Dh))
    for t in range(T):
        p = q_pos[t]
        seen = (kpos >= 0) & (kpos <= p)
        if window:
            seen &= p - kpos < window
        seen[k_cache.shape[0] + t + 1:] = False
        for h in range(Hq):
            s = keys[:, h // G] @ q[t, h].astype(np.float64) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            s = np.where(seen, s, -np.inf)
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ vals[:, h // G]
    return out


@pytest.mark.parametrize("T,cap,Hq,Hkv,Dh,window,softcap", [
    (1, 37, 6, 2, 64, 0, 0.0),      # decode-like: one row over a cache with a 5-key tail
    (5, 0, 4, 1, 256, 0, 0.0),      # first chunk, Gemma's head size, fewer than 16 keys
    (20, 50, 6, 2, 64, 16, 0.0),    # sliding window
    (33, 9, 9, 3, 64, 0, 30.0),     # soft-capped, a cache shorter than one block
    (40, 32, 4, 4, 24, 0, 0.0),     # a head size that is not a whole vector
    (64, 64, 8, 2, 128, 0, 0.0),    # whole blocks only
])
def test_attention_is_numpys(T, cap, Hq, Hkv, Dh, window, softcap):
    q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos = attention_inputs(
        T * 100 + cap, T, cap, Hq, Hkv, Dh)
    scale = 1.0 / np.sqrt(Dh)
    got = np.full((T, Hq, Dh), np.nan, np.float32)
    attention(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap, got)
    want = _reference(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale,
                      softcap)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


@njit(cache=False)
def _tiles(kt, qm, sc, v, om, n):
    for s0 in range(0, sc.shape[1], KW):
        for m0 in range(0, qm.shape[0], QT):
            qk_tile(kt, s0, qm, m0, sc)
    for m0 in range(0, om.shape[0], QT):
        pv_tile(v, n, sc, m0, om)


@njit(cache=False)
def _row_maxes(a, n):
    return np.array([row_max(a, r, n) for r in range(a.shape[0])])


@pytest.mark.parametrize("Dh", [W, 64, 256])
def test_tiles_are_numpys(Dh):
    """qk_tile and pv_tile on their own: scores of 4-row query blocks against transposed
    keys, weighted sums over value rows read through a strided view; row_max with a tail
    and all-negative rows (the softmax's shift: a wrong one would cancel out there)."""
    rng = np.random.default_rng(Dh)
    n, M = 3 * KW, 8
    kt = rng.standard_normal((Dh, n), dtype=np.float32)
    qm = rng.standard_normal((M, Dh), dtype=np.float32)
    v3 = rng.standard_normal((n, 3, Dh), dtype=np.float32)  # strided rows, as the cache's
    sc, om = np.zeros((M, n), np.float32), np.ones((M, Dh), np.float32)
    m = n - 5
    _tiles(kt, qm, sc, v3[:, 1], om, m)
    np.testing.assert_allclose(sc, qm @ kt, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(om, 1.0 + sc[:, :m] @ v3[:m, 1], rtol=1e-4, atol=1e-3)
    a = -np.abs(rng.standard_normal((3, 2 * W + 3), dtype=np.float32)) - 1.0
    a[1, -1] = -0.5  # the largest in the tail
    for k in (1, W, 2 * W + 3):
        np.testing.assert_array_equal(_row_maxes(a, k), a[:, :k].max(axis=1))
