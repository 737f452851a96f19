"""Prefill attention (kernels/attention.attention, float32 cache) against numpy: causal
grouped-query attention over the cache plus the chunk, with empty slots, sliding windows,
soft-capping, head sizes that are and are not whole vectors, and key counts around the
16-key blocks the scores are computed in."""

import numpy as np
import pytest

from edgellm.kernels.attention import attention


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
    rng = np.random.default_rng(T * 100 + cap)
    q = rng.standard_normal((T, Hq, Dh), dtype=np.float32)
    k_new, v_new = (rng.standard_normal((T, Hkv, Dh), dtype=np.float32) for _ in range(2))
    k_cache, v_cache = (rng.standard_normal((cap, Hkv, Dh), dtype=np.float32)
                        for _ in range(2))
    cache_pos = np.arange(cap, dtype=np.int64)
    if cap > 3:
        cache_pos[2] = -1  # an empty slot
    q_pos = np.arange(cap, cap + T, dtype=np.int64)
    scale = 1.0 / np.sqrt(Dh)
    got = np.full((T, Hq, Dh), np.nan, np.float32)
    attention(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap, got)
    want = _reference(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale,
                      softcap)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
