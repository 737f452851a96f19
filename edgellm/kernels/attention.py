"""Causal grouped-query attention over a KV cache plus the current chunk."""

import numpy as np
from numba import prange

from .fastexp import MASKED, exp_shift
from .jit import kernel

NEG = MASKED  # the score of a key a query does not see


@kernel
def combine(coef, nc, rows, out):
    """out[:] = sum over j < nc of coef[j] rows[j, :len(out)], four rows per pass over out:
    long vector loops, no horizontal sums. Scores are q against keys stored transposed
    (coef = q, rows = kt: out[s] = q . k_s); the output is the weights against the values
    (coef = weights, rows = vals)."""
    m = out.shape[0]
    for s in range(m):
        out[s] = 0.0
    j = 0
    while j + 4 <= nc:
        c0, c1, c2, c3 = coef[j], coef[j + 1], coef[j + 2], coef[j + 3]
        r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
        for s in range(m):
            out[s] += c0 * r0[s] + c1 * r1[s] + c2 * r2[s] + c3 * r3[s]
        j += 4
    while j < nc:
        c, r = coef[j], rows[j]
        for s in range(m):
            out[s] += c * r[s]
        j += 1


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
    exp_shift(row, n, best)
    total = np.float32(0.0)
    for s in range(n):
        total += row[s]
    inv = np.float32(1.0) / total
    for s in range(n):
        row[s] *= inv


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
            combine(q[t, h], Dh, kt[kvh], row)  # scores against keys 0..n-1
            _softmax_row(row, n, kpos, q_pos[t], window, sc32, cap32)
            combine(row, n, vals[kvh], out[t, h])
