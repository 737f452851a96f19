"""Causal grouped-query attention over a KV cache plus the current chunk."""

import numpy as np
from numba import prange

from .fastexp import exp32
from .simd import kernel

NEG = np.float32(-1e30)  # the score of a key a query does not see (finite: fastmath)


@kernel
def _score(qr, kr, scale, softcap):
    acc = np.float32(0.0)
    for i in range(kr.shape[0]):
        acc += qr[i] * kr[i]
    acc *= scale
    if softcap > 0:
        acc = softcap * np.tanh(acc / softcap)
    return acc


@kernel
def _group(q, t, kvh, G, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale,
           softcap, sc, out):
    """Query row t, the G heads of KV head kvh: softmax(q.k * scale) @ v over the cache
    slots and chunk rows each sees. Each key and value row is loaded once for the G heads.
    sc [G, >= cap + t + 1] is scratch (scores, then weights)."""
    Dh = q.shape[2]
    cap = k_cache.shape[0]
    p = q_pos[t]
    h0 = kvh * G
    for s in range(cap):
        kp = cache_pos[s]
        if kp >= 0 and kp < p and (window == 0 or p - kp < window):
            kr = k_cache[s, kvh]
            for g in range(G):
                sc[g, s] = _score(q[t, h0 + g], kr, scale, softcap)
        else:
            for g in range(G):
                sc[g, s] = NEG
    for j in range(t + 1):
        kp = q_pos[j]
        if kp <= p and (window == 0 or p - kp < window):
            kr = k_new[j, kvh]
            for g in range(G):
                sc[g, cap + j] = _score(q[t, h0 + g], kr, scale, softcap)
        else:
            for g in range(G):
                sc[g, cap + j] = NEG
    n = cap + t + 1
    for g in range(G):
        best = NEG
        for s in range(n):
            best = max(best, sc[g, s])
        total = np.float32(0.0)
        for s in range(n):
            e = exp32(sc[g, s] - best) if sc[g, s] > NEG else np.float32(0.0)
            sc[g, s] = e
            total += e
        inv = np.float32(1.0) / total
        for s in range(n):
            sc[g, s] *= inv
        for i in range(Dh):
            out[t, h0 + g, i] = 0.0
    for s in range(n):
        vr = v_cache[s, kvh] if s < cap else v_new[s - cap, kvh]
        for g in range(G):
            w = sc[g, s]
            if w != 0.0:
                o = out[t, h0 + g]
                for i in range(Dh):
                    o[i] += w * vr[i]


@kernel(parallel=True)
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
    G = Hq // Hkv
    cap = k_cache.shape[0]
    for tk in prange(T * Hkv):
        # rows in the order 0, T-1, 1, T-2, ..: a row's work grows with t, and prange hands
        # each thread one contiguous run of items, so the runs get equal work this way
        u = tk // Hkv
        t = u // 2 if u % 2 == 0 else T - 1 - u // 2
        sc = np.empty((G, cap + T), dtype=np.float32)
        _group(q, t, tk % Hkv, G, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window,
               np.float32(scale), np.float32(softcap), sc, out)
