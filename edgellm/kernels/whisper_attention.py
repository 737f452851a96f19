"""Whisper's encoder attention on the integer matrix kernels (a quantized model's window).

    quantized_attention(q, k, v, heads, scale, out, act_dtype)
        out [T, D] = per head h (columns h Dh .. h Dh + Dh - 1, D = heads Dh) of one sequence:
        softmax(q_h k_h^T scale) v_h, no mask

A window's attention (1,500 frames, 8 heads of 64) is 4.6 GFLOP a layer, as much as its
q, k, v and output projections together; on float32 register tiles (encoder.py) it ran at
~100 GFLOP/s, the integer kernels run ~250 (int16 activations) to ~350 (int8). So the keys
and values are rounded to q8_0 blocks of 32 (a key's Dh values: Dh / 32 blocks; a value
column over the frames padded to Tp, a multiple of 32, with zeros) and taken as weights:
    scores [n, Tp] = Q_h K_h^T      matmul.py's packed panels, the queries as activations
                                    (act_dtype blocks of 32: the model's); padded keys give 0
    P = exp(scores scale - max)     over the T real keys (exp_fast), 0 past them, each row
                                    quantized to act_dtype blocks as it is written (quant_row)
    out_h = (P V_h) / sum(P)        the same kernels, V_h^T [Dh, Tp] the weight
in chunks of CHUNK queries (their scores stay in L2). The rounding is the one the model's
linear layers already have (q8_0 weights against int16 or int8 activations): keys and values
are rounded as a weight is, queries and probabilities as an activation. Float files keep
encoder.py's float attention (their tokens must equal transformers').
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from . import registry
from .act_quant import quant_row, quantize_rows_parallel
from .encoder import exp_fast, row_max
from .jit import kernel

CHUNK = 512  # queries a pass: scores [512, 1504] float32 and their int16 copy ~4.5 MB


@kernel(parallel=True)
def _split_heads(q, k, v, H, qh, kh, vt):
    """q, k, v [T, D] -> qh [H T, Dh] (head h's queries rows h T ..), kh [H Tp, Dh] (its
    keys, zero rows past T), vt [D, Tp] (values transposed, zero columns past T)."""
    T, D = q.shape
    Dh, Tp = D // H, vt.shape[1]
    for t in prange(Tp):
        for h in range(H):
            for i in range(Dh):
                if t < T:
                    qh[h * T + t, i] = q[t, h * Dh + i]
                    kh[h * Tp + t, i] = k[t, h * Dh + i]
                else:
                    kh[h * Tp + t, i] = np.float32(0.0)
    for c in prange((D + 15) // 16):  # 16 columns of v at a time: whole cache lines read
        for t in range(T):
            for d in range(c * 16, min(D, c * 16 + 16)):
                vt[d, t] = v[t, d]
        for d in range(c * 16, min(D, c * 16 + 16)):
            for t in range(T, Tp):
                vt[d, t] = np.float32(0.0)


@kernel(parallel=True)
def _pack_q8_0(xq, d16, out):
    """q8_0 blocks ([f16 d][32 int8]) from int8 xq [N, K] and its scales' f16 bits [N, K/32]."""
    N, nb = d16.shape
    for r in prange(N):
        for b in range(nb):
            o = b * 34
            out[r, o] = np.uint8(d16[r, b] & 0xff)
            out[r, o + 1] = np.uint8(d16[r, b] >> 8)
            for j in range(32):
                out[r, o + 2 + j] = np.uint8(xq[r, b * 32 + j] & 0xff)


@kernel(parallel=True)
def _softmax_quant(s, T, scale, xq, xd, xs, xds, inv):
    """Each row of s [n, Tp]: exp(s scale - max) over its first T, zero past them, quantized
    into row r of xq/xd/xs/xds (ActQ8's blocks); inv[r] = 1 / the row's sum."""
    n, Tp = s.shape
    for r in prange(n):
        row = s[r]
        top = row_max(row, T) * scale
        total = np.float32(0.0)
        for j in range(T):
            e = exp_fast(row[j] * scale - top)
            row[j] = e
            total += e
        for j in range(T, Tp):
            row[j] = np.float32(0.0)
        inv[r] = np.float32(1.0) / total
        quant_row(s, r, xq, xd, xs, xds)


@kernel(parallel=True)
def _scatter(o, inv, t0, h, out):
    """out[t0 + r, head h's columns] = o[r] * inv[r]."""
    n, Dh = o.shape
    for r in prange(n):
        for i in range(Dh):
            out[t0 + r, h * Dh + i] = o[r, i] * inv[r]


class _Blocks:
    """ActQ8's buffers (linear.py) for rows [N, K]: xq, xd, xs, xds."""

    def __init__(self, N: int, K: int, dtype):
        nb = K // 32
        self.xq = np.empty((N, K), dtype)
        self.xd = np.empty((N, nb), np.float32)
        self.xs = np.empty((N, nb), np.int32)
        self.xds = np.empty((N, nb), np.float32)

    def fill(self, x: np.ndarray) -> _Blocks:
        quantize_rows_parallel(x, self.xq, self.xd, self.xs, self.xds, x.shape[0])
        return self

    def rows(self, a: int, b: int) -> tuple:
        return self.xq[a:b], self.xd[a:b], self.xs[a:b], self.xds[a:b]


def _q8_0(x: np.ndarray) -> np.ndarray:
    """x float32 [N, K] (K % 32 == 0) as read-only q8_0 bytes [N, K / 32 * 34] (the scale
    rounded to f16 after the integers were set: as ggml's quantize_row_q8_0 does)."""
    a = _Blocks(*x.shape, np.int8).fill(x)
    out = np.empty((x.shape[0], x.shape[1] // 32 * 34), np.uint8)
    _pack_q8_0(a.xq, a.xd.astype(np.float16).view(np.uint16), out)
    out.flags.writeable = False  # the matmul kernels' weight specialization
    return out


def quantized_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int,
                        scale: float, out: np.ndarray, act_dtype=np.int16) -> None:
    """out [T, D] = each head's softmax(q k^T scale) v over one sequence (module docstring);
    q, k, v, out C-contiguous float32 [T, D], D = heads Dh with Dh % 32 == 0."""
    T, D = q.shape
    Dh = D // heads
    if not (k.shape == v.shape == out.shape == (T, D)) or Dh * heads != D or Dh % 32 \
            or T < 1:
        raise ValueError(f"quantized_attention: q {list(q.shape)}, k {list(k.shape)}, v "
                         f"{list(v.shape)}, out {list(out.shape)} for {heads} heads")
    Tp = -(-T // 32) * 32
    qh = np.empty((heads * T, Dh), np.float32)
    kh = np.empty((heads * Tp, Dh), np.float32)
    vt = np.empty((D, Tp), np.float32)
    _split_heads(q, k, v, heads, qh, kh, vt)
    kq, vq = _q8_0(kh), _q8_0(vt)
    aq = _Blocks(heads * T, Dh, act_dtype).fill(qh)
    n_max = min(CHUNK, T)
    s = np.empty((n_max, Tp), np.float32)
    inv = np.empty(n_max, np.float32)
    ap = _Blocks(n_max, Tp, act_dtype)
    o = np.empty((n_max, Dh), np.float32)
    mm = registry.INT8["q8_0"].matmul
    threads = numba.get_num_threads()
    sc = np.float32(scale)
    for h in range(heads):
        kw, vw = kq[h * Tp:(h + 1) * Tp], vq[h * Dh:(h + 1) * Dh]
        for t0 in range(0, T, n_max):
            n = min(n_max, T - t0)
            mm(kw, 32, *aq.rows(h * T + t0, h * T + t0 + n), s[:n], n, threads)
            _softmax_quant(s[:n], T, sc, *ap.rows(0, n), inv[:n])
            mm(vw, 32, *ap.rows(0, n), o[:n], n, threads)
            _scatter(o[:n], inv[:n], t0, h, out)

