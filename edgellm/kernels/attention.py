"""Causal grouped-query attention over a KV cache plus the current chunk."""

import numpy as np
from numba import prange

from .simd import kernel

NEG = np.float32(-1e30)  # the score of a key a query does not see (finite: fastmath)


@kernel
def _scores(qr, kt, n, row):
    """row[:n] = kt[:, :n]^T qr: one query head against n keys stored transposed
    (kt [Dh, >= n]). Four dimensions per pass over the row: long vector loops over keys,
    no horizontal sums."""
    Dh = qr.shape[0]
    for s in range(n):
        row[s] = 0.0
    i = 0
    while i + 4 <= Dh:
        q0, q1, q2, q3 = qr[i], qr[i + 1], qr[i + 2], qr[i + 3]
        k0, k1, k2, k3 = kt[i], kt[i + 1], kt[i + 2], kt[i + 3]
        for s in range(n):
            row[s] += q0 * k0[s] + q1 * k1[s] + q2 * k2[s] + q3 * k3[s]
        i += 4
    while i < Dh:
        qi, ki = qr[i], kt[i]
        for s in range(n):
            row[s] += qi * ki[s]
        i += 1


@kernel
def _softmax_row(row, n, kpos, p, window, scale, softcap):
    """row[:n] (raw scores) -> softmax weights of the keys the query at position p sees:
    kpos[s] >= 0 (a filled slot), kpos[s] <= p, and within the window (0: no limit)."""
    best = NEG
    for s in range(n):
        kp = kpos[s]
        v = row[s] * scale
        if softcap > 0:
            v = softcap * np.tanh(v / softcap)
        seen = kp >= 0 and kp <= p and (window == 0 or p - kp < window)
        v = v if seen else NEG
        row[s] = v
        best = max(best, v)
    total = np.float32(0.0)
    for s in range(n):
        e = np.exp(row[s] - best) if row[s] > NEG else np.float32(0.0)
        row[s] = e
        total += e
    inv = np.float32(1.0) / total
    for s in range(n):
        row[s] *= inv


@kernel
def _weighted_values(row, vals, n, o):
    """o[:] = sum over s < n of row[s] vals[s] (vals [>= n, Dh]), four keys per pass."""
    Dh = o.shape[0]
    for i in range(Dh):
        o[i] = 0.0
    s = 0
    while s + 4 <= n:
        w0, w1, w2, w3 = row[s], row[s + 1], row[s + 2], row[s + 3]
        v0, v1, v2, v3 = vals[s], vals[s + 1], vals[s + 2], vals[s + 3]
        for i in range(Dh):
            o[i] += w0 * v0[i] + w1 * v1[i] + w2 * v2[i] + w3 * v3[i]
        s += 4
    while s < n:
        w, v = row[s], vals[s]
        for i in range(Dh):
            o[i] += w * v[i]
        s += 1


@kernel(parallel=True)
def attention(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap,
              out):
    """out[T,Hq,Dh] = causal attention of q[T,Hq,Dh].

    Keys/values: the cache (k_cache/v_cache [cap,Hkv,Dh], slot positions cache_pos [cap],
    -1 = empty), all older than the chunk, plus the chunk's own k_new/v_new [T,Hkv,Dh] at
    positions q_pos [T] (increasing). A query at position p sees keys at positions kp <= p
    with p - kp < window (window 0: no limit). softcap > 0 applies tanh soft-capping.

    The cache and chunk keys are first laid out together per KV head, keys transposed
    (kt [Hkv, Dh, cap + T]) and values as rows (vals [Hkv, cap + T, Dh]), so that a
    query row's scores and weighted sum are long vector loops.
    """
    T, Hq, Dh = q.shape
    Hkv = k_new.shape[1]
    G = Hq // Hkv
    cap = k_cache.shape[0]
    n_all = cap + T
    kt = np.empty((Hkv, Dh, n_all), dtype=np.float32)
    vals = np.empty((Hkv, n_all, Dh), dtype=np.float32)
    kpos = np.empty(n_all, dtype=np.int64)
    for h in prange(Hkv):
        for s in range(n_all):
            kr = k_cache[s, h] if s < cap else k_new[s - cap, h]
            vr = v_cache[s, h] if s < cap else v_new[s - cap, h]
            for i in range(Dh):
                kt[h, i, s] = kr[i]
                vals[h, s, i] = vr[i]
    for s in range(n_all):
        kpos[s] = cache_pos[s] if s < cap else q_pos[s - cap]
    sc32, cap32 = np.float32(scale), np.float32(softcap)
    for tk in prange(T * Hkv):
        # rows in the order 0, T-1, 1, T-2, ..: a row's work grows with t, and prange hands
        # each thread one contiguous run of items, so the runs get equal work this way
        u = tk // Hkv
        t = u // 2 if u % 2 == 0 else T - 1 - u // 2
        kvh = tk % Hkv
        n = cap + t + 1  # the chunk's keys after row t are never seen
        row = np.empty(n, dtype=np.float32)
        for g in range(G):
            h = kvh * G + g
            _scores(q[t, h], kt[kvh], n, row)
            _softmax_row(row, n, kpos, q_pos[t], window, sc32, cap32)
            _weighted_values(row, vals[kvh], n, out[t, h])
