"""Causal grouped-query attention over a KV cache plus the current chunk.

`attention` reads a float32 cache: in register tiles of four query vectors (attention_tiled,
attn_tiles.py), or a query row at a time where a head is not whole vectors
(attention_by_rows). `attention_rows` reads a cache stored as f16 or q8_0 rows
(kv_cache.py), dequantizing one key or value row at a time, never the whole cache.
"""

import numpy as np
from numba import prange
from numba.extending import overload

from .attn_tiles import KW, QT, W, pv_tile, qk_tile, row_max
from .dots import wsum_rows
from .family import tile
from .fastexp import MASKED, exp_shift
from .jit import kernel
from .kv_store import _ROW_TYPE

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
def _scores(keys, n, qs, G, sc, o0, buf):
    """sc[g, o0 + s] = keys[s] . qs[g] for s < n, g < G, one key at a time through buf
    [1, Dh] (a strided row's loop does not vectorize; a contiguous copy's does). For head
    sizes that are not whole vectors (attention_by_rows); keys [>= n, Dh] (rows may be
    strided), qs [G, Dh]."""
    kr = buf[0]
    for j in range(n):
        kr[:] = keys[j]
        for g in range(G):
            qh = qs[g]
            acc = np.float32(0.0)
            for i in range(kr.shape[0]):
                acc += qh[i] * kr[i]
            sc[g, o0 + j] = acc


@kernel
def _key_positions(cache_pos, q_pos):
    """The positions of the cache's slots (-1: empty) and then of the chunk's rows, [cap + T]:
    the keys a query row is scored against, in that order."""
    cap, T = cache_pos.shape[0], q_pos.shape[0]
    kpos = np.empty(cap + T, dtype=np.int64)
    for s in range(cap + T):
        kpos[s] = cache_pos[s] if s < cap else q_pos[s - cap]
    return kpos


@kernel
def _dims(q, k_new):
    """(T, Hq, Dh, Hkv, G) of queries q [T, Hq, Dh] and keys [T, Hkv, Dh]: G query heads
    a KV head."""
    T, Hq, Dh = q.shape
    Hkv = k_new.shape[1]
    return T, Hq, Dh, Hkv, Hq // Hkv


@kernel
def _keys(cache_pos, q_pos, scale, softcap):
    """(_key_positions, scale, softcap as float32): what every query row's softmax takes."""
    return _key_positions(cache_pos, q_pos), np.float32(scale), np.float32(softcap)


@kernel
def _exp_row(sc, r, n, kpos, p, window, scale, softcap):
    """Row r of sc (raw scores) -> exp(score - max) over its first n keys for the keys the
    query at position p sees, 0 for the others: _softmax_row's numerators, not yet divided
    by their sum, which it returns: the caller scales the weighted sum of the values instead
    (Dh multiplies, not n). Each pass is a loop that vectorizes."""
    row = sc[r]
    lo = max(p - window, np.int64(-1)) if window > 0 else np.int64(-1)
    for s in range(n):  # seen: lo < kp <= p (kp >= 0 as lo >= -1)
        kp = kpos[s]
        row[s] = row[s] * scale if (kp > lo) & (kp <= p) else NEG
    if softcap > 0:
        for s in range(n):
            v = row[s]
            row[s] = softcap * np.tanh(v / softcap) if v > NEG else NEG
    exp_shift(row, n, row_max(sc, r, n))
    total = np.float32(0.0)
    for s in range(n):
        total += row[s]
    return total


@kernel
def _softmax_row(sc, r, n, kpos, p, window, scale, softcap):
    """Row r of sc (raw scores) -> softmax weights over its first n keys of the keys the
    query at position p sees: kpos[s] >= 0 (a filled slot), kpos[s] <= p, and within the
    window (0: no limit); 0 for the others."""
    inv = np.float32(1.0) / _exp_row(sc, r, n, kpos, p, window, scale, softcap)
    row = sc[r]
    for s in range(n):
        row[s] *= inv


def attention(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap,
              out):
    """out[T,Hq,Dh] = causal attention of q[T,Hq,Dh].

    Keys/values: the cache (k_cache/v_cache [cap,Hkv,Dh], slot positions cache_pos [cap],
    -1 = empty), all older than the chunk, plus the chunk's own k_new/v_new [T,Hkv,Dh] at
    positions q_pos [T] (increasing). A query at position p sees keys at positions kp <= p
    with p - kp < window (window 0: no limit). softcap > 0 applies tanh soft-capping.
    attention_tiled where the head size is whole vectors, else attention_by_rows.
    """
    run = attention_tiled if q.shape[2] % W == 0 else attention_by_rows
    run(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale, softcap, out)


@kernel(parallel=True)
def attention_tiled(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale,
                    softcap, out):
    """`attention` in tiles (attn_tiles.py): the keys laid out transposed per KV head (kt
    [Hkv, Dh, n] zero-padded to whole KW-key tiles), the value rows read in place; work
    items are (QT query rows, KV head), whose QT * G query vectors (each row's G heads) score
    every key the last row sees, four vectors per qk_tile, then take the softmax's
    numerators (each row's own keys; its weights past them 0) and the weighted values,
    four per pv_tile, divided by the row's sum at the end. Dh % W == 0."""
    T, Hq, Dh, Hkv, G = _dims(q, k_new)
    cap = k_cache.shape[0]
    n_all = cap + T
    n_pad = (n_all + KW - 1) // KW * KW
    kt = np.empty((Hkv, Dh, n_pad), dtype=np.float32)
    for h in prange(Hkv):
        for s in range(n_all):
            kr = k_cache[s, h] if s < cap else k_new[s - cap, h]
            for i in range(Dh):
                kt[h, i, s] = kr[i]
        for i in range(Dh):
            for s in range(n_all, n_pad):
                kt[h, i, s] = 0.0
    kpos, sc32, cap32 = _keys(cache_pos, q_pos, scale, softcap)
    tiles = (T + QT - 1) // QT
    for item in prange(tiles * Hkv):
        # tiles in the order 0, last, 1, last - 1, ..: a tile's work grows with its rows, and
        # prange hands each thread one contiguous run of items
        u = item // Hkv
        ti = u // 2 if u % 2 == 0 else tiles - 1 - u // 2
        kvh = item % Hkv
        t0 = ti * QT
        t1 = min(T, t0 + QT)
        M = (t1 - t0) * G
        Mp = (M + QT - 1) // QT * QT
        n_max = cap + t1  # the keys the tile's last row sees
        n_tile = (n_max + KW - 1) // KW * KW
        qm = np.zeros((Mp, Dh), dtype=np.float32)
        for r in range(M):
            qm[r] = q[t0 + r // G, kvh * G + r % G]
        sc = np.empty((Mp, n_tile), dtype=np.float32)
        for s0 in range(0, n_tile, KW):
            for m0 in range(0, Mp, QT):
                qk_tile(kt[kvh], s0, qm, m0, sc)
        inv = np.zeros(Mp, dtype=np.float32)
        for r in range(Mp):
            row = sc[r]
            nt = 0
            if r < M:
                t = t0 + r // G
                nt = cap + t + 1
                inv[r] = np.float32(1.0) / _exp_row(sc, r, nt, kpos, q_pos[t], window, sc32,
                                                    cap32)
            for s in range(nt, n_max):
                row[s] = 0.0
        om = np.zeros((Mp, Dh), dtype=np.float32)
        for m0 in range(0, Mp, QT):  # the cache's value rows, then the chunk's
            pv_tile(v_cache[:, kvh], cap, sc, m0, om)
            pv_tile(v_new[:, kvh], t1, sc[:, cap:], m0, om)
        for r in range(M):
            o = out[t0 + r // G, kvh * G + r % G]
            for i in range(Dh):
                o[i] = om[r, i] * inv[r]


@kernel(parallel=True)
def attention_by_rows(q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos, window, scale,
                      softcap, out):
    """`attention` one query row at a time, for head sizes that are not whole vectors
    (attention_tiled takes the others). Work items are (query row t, KV head): the G query
    heads of the group score the cache's keys and the chunk's first t + 1 one key at a
    time (_scores), then sum the value rows weighted (wsum_rows, read in place: a KV
    head's rows are strided views)."""
    T, Hq, Dh, Hkv, G = _dims(q, k_new)
    cap = k_cache.shape[0]
    kpos, sc32, cap32 = _keys(cache_pos, q_pos, scale, softcap)
    for tk in prange(T * Hkv):
        # rows in the order 0, T-1, 1, T-2, ..: a row's work grows with t, and prange hands
        # each thread one contiguous run of items, so the runs get equal work this way
        u = tk // Hkv
        t = u // 2 if u % 2 == 0 else T - 1 - u // 2
        kvh = tk % Hkv
        n = cap + t + 1  # the chunk's keys after row t are never seen
        buf = np.empty((1, Dh), dtype=np.float32)
        sc = np.empty((G, n), dtype=np.float32)
        qs = q[t, kvh * G:(kvh + 1) * G]
        _scores(k_cache[:, kvh], cap, qs, G, sc, 0, buf)
        _scores(k_new[:, kvh], t + 1, qs, G, sc, cap, buf)
        ot = out[t]
        for g in range(G):
            _softmax_row(sc, g, n, kpos, q_pos[t], window, sc32, cap32)
            h = kvh * G + g
            for i in range(Dh):
                ot[h, i] = 0.0
            wsum_rows(v_cache[:, kvh], 0, cap, sc, g, 0, ot, h)
            wsum_rows(v_new[:, kvh], 0, t + 1, sc, g, cap, ot, h)


def _stored_row(rows, r, out):
    """out[0, :] = row r of a stored cache (f16 bits or q8_0 blocks) as float32."""


@overload(_stored_row)
def _stored_row_impl(rows, r, out):
    code = _ROW_TYPE.get(rows.dtype)
    if code is None:
        return None
    return lambda rows, r, out: tile(code, "row", rows, 32, r, out, 0)


@kernel
def _key_row(rows, new, s, cap, kvh, Hkv, buf):
    """Key (or value) s of KV head kvh: stored row s (< cap) decoded into buf, else this
    call's row s - cap."""
    if s < cap:
        _stored_row(rows, s * Hkv + kvh, buf)
        return buf[0]
    return new[s - cap, kvh]


TILE = 16  # query rows that share one dequantization of each cached row


@kernel(parallel=True)
def attention_rows(q, k_new, v_new, q_pos, k_rows, v_rows, cache_pos, window, scale, softcap,
                   out):
    """`attention` over a stored cache: k_rows/v_rows [cap * Hkv, width] hold slot s, KV head
    h at row s * Hkv + h, as the bits of float16 (uint16, width Dh) or ggml q8_0 blocks
    (uint8, width Dh/32 * 34); cache_pos [cap]. Work items are (KV head, tile of TILE query
    rows): each cached row is dequantized once per item into a [1, Dh] buffer."""
    T, Hq, Dh, Hkv, G = _dims(q, k_new)
    cap = cache_pos.shape[0]
    kpos, sc32, cap32 = _keys(cache_pos, q_pos, scale, softcap)
    tiles = (T + TILE - 1) // TILE
    for item in prange(tiles * Hkv):
        kvh = item % Hkv
        t0 = (item // Hkv) * TILE
        t1 = min(T, t0 + TILE)
        n = cap + t1  # keys the tile's last row sees; row t sees the first cap + t + 1
        scores = np.empty(((t1 - t0) * G, n), dtype=np.float32)
        buf = np.empty((1, Dh), dtype=np.float32)
        for s in range(n):
            key = _key_row(k_rows, k_new, s, cap, kvh, Hkv, buf)
            for t in range(max(t0, s - cap), t1):
                for g in range(G):
                    qh = q[t, kvh * G + g]
                    acc = np.float32(0.0)
                    for i in range(Dh):
                        acc += qh[i] * key[i]
                    scores[(t - t0) * G + g, s] = acc
        for t in range(t0, t1):
            for g in range(G):
                _softmax_row(scores, (t - t0) * G + g, cap + t + 1, kpos, q_pos[t], window,
                             sc32, cap32)
                o = out[t, kvh * G + g]
                for i in range(Dh):
                    o[i] = 0.0
        for s in range(n):
            val = _key_row(v_rows, v_new, s, cap, kvh, Hkv, buf)
            for t in range(max(t0, s - cap), t1):
                for g in range(G):
                    w = scores[(t - t0) * G + g, s]
                    if w != 0.0:
                        o = out[t, kvh * G + g]
                        for i in range(Dh):
                            o[i] += w * val[i]
