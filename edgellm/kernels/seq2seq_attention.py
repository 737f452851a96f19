"""An encoder-decoder's decoder attention (Whisper), a few query rows per sequence.

    cross_attention(q, kt, v, out, scales=None)
        q [B, T, H, Dh] (scaled), kt [H, Dh, P], v [H, P, Dh] (one window's encoder keys
        and values, shared by the B sequences), out [B, T, H, Dh]:
        out[b, t, h] = softmax(q[b, t, h] kt[h]) v[h]
        scales (ks [H, Dh], vs [H, P]): kt and v are integers (int8 or int16,
        quantize_cross), channel i of head h's keys is ks[h, i] kt[h, i, :], its value p
        vs[h, p] v[h, p]
    quantize_cross(k, v, H, k_dtype, v_dtype) -> kt, v, ks, vs
        k, v [P, H Dh] float32 (the cross projections): the keys of each channel (over
        the P frames) and each value's Dh numbers rounded to the integer type on one scale
        (their absolute maximum), to nearest (halves away from 0): keys per channel,
        values per token, as KIVI (Liu et al. 2024) found their outliers lie
    self_attention(q, k, v, S, out)
        q [B, T, H, Dh] (scaled), k, v [B, n_ctx, H, Dh] (the self-attention cache, the T
        new rows at S - T .. S - 1 already in it), out [B, T, H, Dh]: row t attends to
        positions 0 .. S - T + t (causal)

Self-attention: each (sequence, row, head) is one work item (numpy's batched matmul ran
them one small product at a time, with a copy of the cache's strided keys per call).
Cross-attention of a step (one row per sequence): each (row, head) one item, all the
sequences together, each group of four keys (then values) read once for all the beams, in
the order one sequence alone sums them (a beam's result is what greedy would get; a step
is memory-bound: the register tiles gave the same time from memory). Of a prompt's rows:
each (head, block of rows) one item on prefill attention's register tiles, each key and
value read once for four rows (where each row read all of them alone). The softmax is
exact (fastexp's exp_shift: libm's expf), summed in float32 as numpy's was.

Integer keys and values (a quantized model's window): a greedy step read 37 MB of float32
cross keys and values, the largest part of its bytes; int16 halves it, int8 quarters it.
The sums are the float ones over the integers converted in the loop, one sequence after
another (the keys and values come from memory for the first, from cache after), a key
channel's scale taken into the query and a value's into its softmax weight (no extra
pass), the softmax on encoder.py's exp_fast (within 3e-7; libm's expf was a fifth of the
kernel's time); a prompt's rows convert a head once per work item and take the register
tiles.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .attention import combine
from .attn_tiles import KW, QT, W, pv_tile, qk_tile
from .encoder import exp_fast, row_max, softmax_scaled
from .jit import kernel

ONE = np.float32(1.0)  # softmax_scaled's scale: x * 1 is x, so the weights are unscaled


@kernel
def _combine_rows(coef, rows, out):
    """out[b, :] = sum over j of coef[b, j] rows[j, :] for every b: attention.combine's
    sums (four rows a pass, the same order), each group of four rows read once for all b
    (from cache after the first). rows float32 (or integers: _combine_int)."""
    B, nc = coef.shape
    m = out.shape[1]
    out[:] = 0.0
    j = 0
    while j + 4 <= nc:
        r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
        for b in range(B):
            c0, c1, c2, c3 = coef[b, j], coef[b, j + 1], coef[b, j + 2], coef[b, j + 3]
            o = out[b]
            for s in range(m):
                o[s] += c0 * r0[s] + c1 * r1[s] + c2 * r2[s] + c3 * r3[s]
        j += 4
    while j < nc:
        r = rows[j]
        for b in range(B):
            c, o = coef[b, j], out[b]
            for s in range(m):
                o[s] += c * r[s]
        j += 1


@kernel
def _combine_int(coef, rows, out):
    """_combine_rows over integer rows [nc, m], each converted to float32 in the loop, one
    b after another (the rows then come from cache): the sums of one b are the same for
    any number of them. (Converting each group of four rows once into float scratch for
    all b, in _combine_rows' b-inner order, took 2-3x as long for one b and for five.)"""
    B, nc = coef.shape
    m = out.shape[1]
    for b in range(B):
        o, c = out[b], coef[b]
        for s in range(m):
            o[s] = 0.0
        j = 0
        while j + 4 <= nc:
            c0, c1, c2, c3 = c[j], c[j + 1], c[j + 2], c[j + 3]
            r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
            for s in range(m):
                o[s] += c0 * np.float32(r0[s]) + c1 * np.float32(r1[s]) + \
                    c2 * np.float32(r2[s]) + c3 * np.float32(r3[s])
            j += 4
        while j < nc:
            w, r = c[j], rows[j]
            for s in range(m):
                o[s] += w * np.float32(r[s])
            j += 1


@kernel(parallel=True)
def _cross(q, kt, v, out):
    B, T, H, Dh = q.shape
    P = kt.shape[2]
    for item in prange(T * H):  # the sequences inside: each block of a head's encoder
        t, h = item // H, item % H  # keys and values read once for all of them
        if B == 1:  # one sequence: no copies in and out
            row = np.empty(P, dtype=np.float32)
            combine(q[0, t, h], Dh, kt[h], row)
            softmax_scaled(row, P, ONE)
            combine(row, P, v[h], out[0, t, h])
            continue
        qs = np.empty((B, Dh), dtype=np.float32)
        rows = np.empty((B, P), dtype=np.float32)
        ob = np.empty((B, Dh), dtype=np.float32)
        for b in range(B):
            qs[b] = q[b, t, h]
        _combine_rows(qs, kt[h], rows)  # rows[b, p] = q_b . k_p: long loops over P
        for b in range(B):
            softmax_scaled(rows[b], P, ONE)
        _combine_rows(rows, v[h], ob)
        for b in range(B):
            out[b, t, h] = ob[b]


@kernel(parallel=True)
def _cross_int(q, kt, v, ks, vs, out):
    """_cross over integer keys and values (module docstring): the same sums, each key
    channel's scale taken into the query, each value's into its softmax weight."""
    B, T, H, Dh = q.shape
    P = kt.shape[2]
    for item in prange(T * H):
        t, h = item // H, item % H
        qs = np.empty((B, Dh), dtype=np.float32)
        rows = np.empty((B, P), dtype=np.float32)
        ob = np.empty((B, Dh), dtype=np.float32)
        kh, vh = ks[h], vs[h]
        for b in range(B):  # a channel's key scale taken into the query
            for i in range(Dh):
                qs[b, i] = q[b, t, h, i] * kh[i]
        _combine_int(qs, kt[h], rows)
        for b in range(B):  # softmax on exp_fast (within 3e-7), each value's scale in
            r = rows[b]
            top = row_max(r, P)
            total = np.float32(0.0)
            for p in range(P):
                r[p] = exp_fast(r[p] - top)
                total += r[p]
            inv = np.float32(1.0) / total
            for p in range(P):
                r[p] *= inv * vh[p]
        _combine_int(rows, v[h], ob)
        for b in range(B):
            out[b, t, h] = ob[b]


ROWS = 64  # query rows per work item of _cross_tiles: its scores [64, 1,500] stay in L2


@kernel
def _tile_rows(q, r0, n, h, k, vh, out):
    """_cross_tiles' work item: rows r0 .. r0 + n - 1 of head h, its keys k [Dh, P] and
    values vh [P, Dh] float32."""
    Dh, P = k.shape
    full = P // KW * KW
    m = (n + QT - 1) // QT * QT  # whole tiles of rows: the padding rows score zeros
    qm = np.zeros((m, Dh), dtype=np.float32)
    for r in range(n):
        qm[r] = q[r0 + r, h]
    sc = np.zeros((m, P), dtype=np.float32)
    for s0 in range(0, full, KW):
        for m0 in range(0, m, QT):
            qk_tile(k, s0, qm, m0, sc)
    for r in range(n):
        for p in range(full, P):
            acc = np.float32(0.0)
            for i in range(Dh):
                acc += qm[r, i] * k[i, p]
            sc[r, p] = acc
        softmax_scaled(sc[r], P, ONE)
    om = np.zeros((m, Dh), dtype=np.float32)
    for m0 in range(0, m, QT):
        pv_tile(vh, P, sc, m0, om)
    for r in range(n):
        out[r0 + r, h] = om[r]


@kernel(parallel=True)
def _cross_tiles(q, kt, v, out):
    """_cross for several query rows (beams, or a prompt's rows) on the register tiles of
    prefill attention (attn_tiles.py: four rows x 32 keys a qk_tile, four rows a pv_tile,
    where _combine_rows' loads and stores of each row's sums held it to a fraction of the
    multiply-add rate): each (head, block of ROWS rows) one item, its rows' scores [R, P],
    the keys past the last whole tile scored one at a time. q [R, H, Dh], Dh % W == 0."""
    R, H, Dh = q.shape
    nb = (R + ROWS - 1) // ROWS
    for item in prange(H * nb):
        h, r0 = item // nb, (item % nb) * ROWS
        _tile_rows(q, r0, min(R, r0 + ROWS) - r0, h, kt[h], v[h], out)


@kernel(parallel=True)
def _cross_tiles_int(q, kt, v, ks, vs, out):
    """_cross_tiles over integer keys and values: each item converts its head to float32
    first (2 P Dh numbers against the tiles' 2 P Dh multiply-adds for each of its rows)."""
    R, H, Dh = q.shape
    P = kt.shape[2]
    nb = (R + ROWS - 1) // ROWS
    for item in prange(H * nb):
        h, r0 = item // nb, (item % nb) * ROWS
        k = np.empty((Dh, P), dtype=np.float32)
        vh = np.empty((P, Dh), dtype=np.float32)
        kq, vq, kh, vsh = kt[h], v[h], ks[h], vs[h]
        for i in range(Dh):
            for p in range(P):
                k[i, p] = np.float32(kq[i, p]) * kh[i]
        for p in range(P):
            for i in range(Dh):
                vh[p, i] = np.float32(vq[p, i]) * vsh[p]
        _tile_rows(q, r0, min(R, r0 + ROWS) - r0, h, k, vh, out)


@kernel
def _absmax_inv(x, c0, n, qmax, lanes):
    """(scale, 1 / scale) putting x[c0 .. c0 + n - 1]'s absolute maximum at qmax (0, 0 for
    zeros); n a multiple of 16, lanes [16] scratch (16-lane maxima: a float max() loop
    does not vectorize)."""
    for j in range(16):
        lanes[j] = abs(x[c0 + j])
    for i in range(c0 + 16, c0 + n, 16):
        for j in range(16):
            y = abs(x[i + j])
            lanes[j] = y if y > lanes[j] else lanes[j]
    amax = lanes[0]
    for j in range(1, 16):
        amax = lanes[j] if lanes[j] > amax else amax
    if amax == 0:
        return np.float32(0.0), np.float32(0.0)
    return amax / qmax, qmax / amax


@kernel
def _nearest(x):
    """x rounded to the nearest integer, halves away from zero (np.rint is a libm call a
    number: 8 ms a layer's cross keys and values; this vectorizes)."""
    return np.int32(x + np.float32(0.5)) if x >= 0 else np.int32(x - np.float32(0.5))


@kernel(parallel=True)
def _quantize_keys(k, H, qmax, kt, ks):
    """k [P, H Dh] -> kt [H, Dh, P] on one scale per channel, ks [H, Dh]."""
    P, D = k.shape
    Dh = D // H
    amax = np.zeros(D, dtype=np.float32)
    for p in range(P):  # along the rows: the channels' maxima as vectors
        for c in range(D):
            y = abs(k[p, c])
            amax[c] = y if y > amax[c] else amax[c]
    inv = np.empty(D, dtype=np.float32)
    for c in range(D):
        ks[c // Dh, c % Dh] = amax[c] / qmax
        inv[c] = qmax / amax[c] if amax[c] > 0 else np.float32(0.0)
    for item in prange(H * ((P + 63) // 64)):  # (head, 64 frames): kt's writes a line each
        h, p0 = item % H, (item // H) * 64
        for p in range(p0, min(P, p0 + 64)):
            for i in range(Dh):
                kt[h, i, p] = _nearest(k[p, h * Dh + i] * inv[h * Dh + i])


@kernel(parallel=True)
def _quantize_values(v, H, qmax, vq, vs):
    """v [P, H Dh] -> vq [H, P, Dh] on one scale per value (frame and head), vs [H, P]."""
    P, D = v.shape
    Dh = D // H
    for item in prange(H * ((P + 63) // 64)):
        h, p0 = item % H, (item // H) * 64
        lanes = np.empty(16, dtype=np.float32)
        for p in range(p0, min(P, p0 + 64)):
            vs[h, p], inv = _absmax_inv(v[p], h * Dh, Dh, qmax, lanes)
            for i in range(Dh):
                vq[h, p, i] = _nearest(v[p, h * Dh + i] * inv)


@kernel(parallel=True)
def _self(q, k, v, S, out):
    B, T, H, Dh = q.shape
    for item in prange(B * T * H):
        b, t, h = item // (T * H), (item // H) % T, item % H
        n = S - T + t + 1
        row = np.empty(n, dtype=np.float32)
        for j in range(n):
            s = np.float32(0.0)
            for i in range(Dh):
                s += q[b, t, h, i] * k[b, j, h, i]
            row[j] = s
        softmax_scaled(row, n, ONE)
        o = out[b, t, h]
        for i in range(Dh):
            o[i] = np.float32(0.0)
        for j in range(n):
            w = row[j]
            for i in range(Dh):
                o[i] += w * v[b, j, h, i]


def _check(q, out) -> None:
    for name, a in (("q", q), ("out", out)):
        if a.dtype != np.float32 or a.ndim != 4 or not a.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous 4-D float32 array")
    if out.shape != q.shape:
        raise ValueError(f"out {list(out.shape)} must match q {list(q.shape)}")


def cross_attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray, out: np.ndarray,
                    scales=None) -> None:
    """out[b, t, h] = softmax(q[b, t, h] kt[h]) v[h] (module docstring); scales (ks, vs):
    kt and v are integers on those scales."""
    _check(q, out)
    B, T, H, Dh = q.shape
    kinds = (np.float32,) if scales is None else (np.int8, np.int16)
    if kt.ndim != 3 or kt.shape[:2] != (H, Dh) or v.shape != (H, kt.shape[2], Dh) or \
            not (kt.flags.c_contiguous and v.flags.c_contiguous) or \
            kt.dtype.type not in kinds or v.dtype.type not in kinds:
        raise ValueError(f"kt {list(kt.shape)} and v {list(v.shape)} must be C-contiguous "
                         f"[{H}, {Dh}, P] and [{H}, P, {Dh}], float32 (int8 or int16 with "
                         "scales)")
    if scales is not None:
        ks, vs = scales
        for name, a, n in (("ks", ks, Dh), ("vs", vs, kt.shape[2])):
            if a.shape != (H, n) or a.dtype != np.float32 or not a.flags.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous float32 [{H}, {n}]")
        if not q.size:
            return
        if T > 1 and Dh % W == 0:
            _cross_tiles_int(q.reshape(B * T, H, Dh), kt, v, ks, vs, out.reshape(B * T, H, Dh))
        else:
            _cross_int(q, kt, v, ks, vs, out)
        return
    if T > 1 and Dh % W == 0:  # a prompt's rows: the register tiles
        _cross_tiles(q.reshape(B * T, H, Dh), kt, v, out.reshape(B * T, H, Dh))
    elif q.size:  # a step's row of each sequence: each beam's sums those it gets alone
        _cross(q, kt, v, out)


def quantize_cross(k: np.ndarray, v: np.ndarray, heads: int, k_dtype=np.int8,
                   v_dtype=None):
    """(kt [H, Dh, P] of k_dtype, v [H, P, Dh] of v_dtype (default k_dtype), ks [H, Dh],
    vs [H, P]) of a window's cross keys and values k, v [P, H Dh] float32 (module
    docstring)."""
    if k.shape != v.shape or k.ndim != 2 or k.shape[1] % heads or k.dtype != np.float32 or \
            v.dtype != np.float32 or not (k.flags.c_contiguous and v.flags.c_contiguous):
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} must be C-contiguous "
                         f"float32 [P, {heads} Dh]")
    P, Dh = k.shape[0], k.shape[1] // heads
    if Dh % 16:
        raise ValueError(f"cross keys of {Dh} per head: a multiple of 16")
    kd = np.dtype(k_dtype).type
    vd = kd if v_dtype is None else np.dtype(v_dtype).type
    if kd not in (np.int8, np.int16) or vd not in (np.int8, np.int16):
        raise ValueError(f"cross keys and values as {np.dtype(kd).name}, {np.dtype(vd).name}: "
                         "int8 or int16")
    kt, vq = np.empty((heads, Dh, P), kd), np.empty((heads, P, Dh), vd)
    ks, vs = np.empty((heads, Dh), np.float32), np.empty((heads, P), np.float32)
    _quantize_keys(k, heads, np.float32(np.iinfo(kd).max), kt, ks)
    _quantize_values(v, heads, np.float32(np.iinfo(vd).max), vq, vs)
    return kt, vq, ks, vs


def self_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, S: int,
                   out: np.ndarray) -> None:
    """out[b, t, h] = causal softmax(q[b, t, h] k[b, :S - T + t + 1, h]^T) v (module
    docstring)."""
    _check(q, out)
    B, T, H, Dh = q.shape
    if k.shape != v.shape or k.ndim != 4 or k.shape[0] != B or k.shape[2:] != (H, Dh) or \
            not (k.flags.c_contiguous and v.flags.c_contiguous) or \
            k.dtype != np.float32 or v.dtype != np.float32:
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} must be C-contiguous "
                         f"float32 [{B}, n_ctx, {H}, {Dh}]")
    if not T <= S <= k.shape[1]:
        raise ValueError(f"{S} positions for {T} new rows and a cache of {k.shape[1]}")
    if q.size:
        _self(q, k, v, int(S), out)
