"""Causal grouped-query attention over a KV cache plus the current chunk."""

import numpy as np
from numba import njit, prange

from .. import numba_setup  # noqa: F401

OPT = dict(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, cache=True)


@njit(**OPT)
def _head(q, t, h, kvh, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale,
          softcap, scores, out):
    """One query row: softmax(q.k * scale) @ v over the cache slots and chunk rows it sees."""
    Dh = q.shape[2]
    cap = k_cache.shape[0]
    p = q_pos[t]
    best = np.float32(-np.inf)
    for s in range(cap):
        kp = cache_pos[s]
        ok = kp >= 0 and kp < p and (window == 0 or p - kp < window)
        if ok:
            acc = np.float32(0.0)
            for i in range(Dh):
                acc += q[t, h, i] * k_cache[s, kvh, i]
            acc *= scale
            if softcap > 0:
                acc = softcap * np.tanh(acc / softcap)
            scores[s] = acc
            best = max(best, acc)
        else:
            scores[s] = -np.inf
    for j in range(t + 1):
        kp = q_pos[j]
        if kp <= p and (window == 0 or p - kp < window):
            acc = np.float32(0.0)
            for i in range(Dh):
                acc += q[t, h, i] * k_new[j, kvh, i]
            acc *= scale
            if softcap > 0:
                acc = softcap * np.tanh(acc / softcap)
            scores[cap + j] = acc
            best = max(best, acc)
        else:
            scores[cap + j] = -np.inf
    total = np.float32(0.0)
    for s in range(cap + t + 1):
        e = np.exp(scores[s] - best) if scores[s] != -np.inf else np.float32(0.0)
        scores[s] = e
        total += e
    inv = np.float32(1.0) / total
    for i in range(Dh):
        out[t, h, i] = 0.0
    for s in range(cap):
        w = scores[s] * inv
        if w != 0.0:
            for i in range(Dh):
                out[t, h, i] += w * v_cache[s, kvh, i]
    for j in range(t + 1):
        w = scores[cap + j] * inv
        if w != 0.0:
            for i in range(Dh):
                out[t, h, i] += w * v_new[j, kvh, i]


@njit(**OPT, parallel=True)
def attention(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap,
              out):
    """out[T,Hq,Dh] = causal attention of q[T,Hq,Dh].

    Keys/values: the cache (k_cache/v_cache [cap,Hkv,Dh], slot positions cache_pos [cap],
    -1 = empty), all older than the chunk, plus the chunk's own k_new/v_new [T,Hkv,Dh] at
    positions q_pos [T]. A query at position p sees keys at positions kp <= p with
    p - kp < window (window 0: no limit). softcap > 0 applies tanh soft-capping.
    """
    T, Hq, _ = q.shape
    Hkv = k_new.shape[1]
    group = Hq // Hkv
    cap = k_cache.shape[0]
    for th in prange(T * Hq):
        t = th // Hq
        h = th % Hq
        scores = np.empty(cap + T, dtype=np.float32)
        _head(q, t, h, h // group, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window,
              np.float32(scale), np.float32(softcap), scores, out)
