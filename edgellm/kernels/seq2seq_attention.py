"""An encoder-decoder's decoder attention (Whisper), a few query rows per sequence.

    cross_attention(q, kt, v, out)
        q [B, T, H, Dh] (scaled), kt [H, Dh, P], v [H, P, Dh] (one window's encoder keys
        and values, shared by the B sequences), out [B, T, H, Dh]:
        out[b, t, h] = softmax(q[b, t, h] kt[h]) v[h]
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
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .attention import combine
from .attn_tiles import KW, QT, W, pv_tile, qk_tile
from .encoder import softmax_scaled
from .jit import kernel

ONE = np.float32(1.0)  # softmax_scaled's scale: x * 1 is x, so the weights are unscaled


@kernel
def _combine_rows(coef, rows, out):
    """out[b, :] = sum over j of coef[b, j] rows[j, :] for every b: attention.combine's
    sums (four rows a pass, the same order), each group of four rows read once for all b
    (from cache after the first)."""
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


ROWS = 64  # query rows per work item of _cross_tiles: its scores [64, 1,500] stay in L2


@kernel(parallel=True)
def _cross_tiles(q, kt, v, out):
    """_cross for several query rows (beams, or a prompt's rows) on the register tiles of
    prefill attention (attn_tiles.py: four rows x 32 keys a qk_tile, four rows a pv_tile,
    where _combine_rows' loads and stores of each row's sums held it to a fraction of the
    multiply-add rate): each (head, block of ROWS rows) one item, its rows' scores [R, P],
    the keys past the last whole tile scored one at a time. q [R, H, Dh], Dh % W == 0."""
    R, H, Dh = q.shape
    P = kt.shape[2]
    full = P // KW * KW
    nb = (R + ROWS - 1) // ROWS
    for item in prange(H * nb):
        h, r0 = item // nb, (item % nb) * ROWS
        n = min(R, r0 + ROWS) - r0
        m = (n + QT - 1) // QT * QT  # whole tiles of rows: the padding rows score zeros
        qm = np.zeros((m, Dh), dtype=np.float32)
        for r in range(n):
            qm[r] = q[r0 + r, h]
        sc = np.zeros((m, P), dtype=np.float32)
        k = kt[h]
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
            pv_tile(v[h], P, sc, m0, om)
        for r in range(n):
            out[r0 + r, h] = om[r]


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


def cross_attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """out[b, t, h] = softmax(q[b, t, h] kt[h]) v[h] (module docstring)."""
    _check(q, out)
    B, T, H, Dh = q.shape
    if kt.ndim != 3 or kt.shape[:2] != (H, Dh) or v.shape != (H, kt.shape[2], Dh) or \
            not (kt.flags.c_contiguous and v.flags.c_contiguous) or \
            kt.dtype != np.float32 or v.dtype != np.float32:
        raise ValueError(f"kt {list(kt.shape)} and v {list(v.shape)} must be C-contiguous "
                         f"float32 [{H}, {Dh}, P] and [{H}, P, {Dh}]")
    if T > 1 and Dh % W == 0:  # a prompt's rows: the register tiles
        _cross_tiles(q.reshape(B * T, H, Dh), kt, v, out.reshape(B * T, H, Dh))
    elif q.size:  # a step's row of each sequence: each beam's sums those it gets alone
        _cross(q, kt, v, out)


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
