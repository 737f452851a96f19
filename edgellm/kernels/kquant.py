"""Kernels for ggml's K-quants (q2_k .. q6_k, super-blocks of 256), q5_0 and q5_1: decode, prefill
and the embedding lookup. Plain numba (no IR intrinsics), float32 activations.

Each type has a row dequantizer (`_deq_<type>`, dispatched by `_dequant` on the type's code
quant.TYPES[name].code) that writes value = dsub q - msub exactly as quant_k.parts defines
it, with its inner loops vectorized by LLVM (see `_lanes`). Then

  mvp_rows_k(kind, w, x, out, r0, r1)   decode: out[0, r0:r1] = W[r0:r1] @ x[0], each row
                                        dequantized into a K-float scratch (L1) and dotted
  mvp_k(kind, w, x, out)                the same over all rows, parallel in chunks
  gemm_k(kind, w, x, out)               prefill: out[T, N] = x @ W.T, 16 rows dequantized
                                        once into a panel, register-blocked FMA tiles
                                        (panel_gemm.py's)
  embed_k(kind, w, ids, out)            out[t] = row ids[t] dequantized

These are the precise path's kernels (and the only ones of q2_k and q3_k); q5_0, q5_1,
q4_k, q5_k and q6_k run kquant_int.py's integer-activation kernels by default.
w is uint8 [N, row_bytes] in ggml's bytes.
Callers validate shapes (linear.py, step/fused.py): these kernels do not check bounds.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..modelfile import quant
from .family import by_kind
from .jit import GLUE, kernel
from .panel_gemm import W, _group, _tail

__all__ = ["embed_k", "gemm_k", "mvp_k", "mvp_rows_k"]

Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (
    quant.TYPES[n].code for n in ("q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"))
CHUNK = 16  # rows per parallel work item
# every float16 bit pattern as float32: the scales' conversion is one load
F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@kernel
def _f16(row, o):
    return F16[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)]


@kernel
def _sc_min_k4(row, s, j):
    """get_scale_min_k4: sub-block j's 6-bit scale and min from the 12 bytes at s."""
    if j < 4:
        return np.int32(row[s + j]) & 63, np.int32(row[s + j + 4]) & 63
    sc = (np.int32(row[s + j + 4]) & 15) | ((np.int32(row[s + j - 4]) >> 6) << 4)
    m = (np.int32(row[s + j + 4]) >> 4) | ((np.int32(row[s + j]) >> 6) << 4)
    return sc, m


# Row dequantizers: row (uint8 [row_bytes]) -> out float32 [K]. L is 32, passed at run time
# (`_lanes`): a constant trip count is unrolled whole before LLVM's loop vectorizer sees
# it, and the unrolled code stays scalar (notes/kernels.md); L // 2 = 16 likewise.

@kernel
def _deq_q45_k(row, out, L, five):
    bb = 176 if five else 144
    for sb in range(out.shape[0] // 256):
        o = sb * bb
        d, dmin = _f16(row, o), _f16(row, o + 2)
        qs = row[o + (48 if five else 16):o + bb]
        qh = row[o + 16:o + 48]
        for c in range(4):
            sc0, m0 = _sc_min_k4(row, o + 4, 2 * c)
            sc1, m1 = _sc_min_k4(row, o + 4, 2 * c + 1)
            d0, d1 = d * np.float32(sc0), d * np.float32(sc1)
            n0, n1 = dmin * np.float32(m0), dmin * np.float32(m1)
            y = out[sb * 256 + 64 * c:sb * 256 + 64 * c + 64]
            qc = qs[32 * c:32 * c + 32]
            if five:
                for l in range(L):
                    b, h = np.int32(qc[l]), np.int32(qh[l]) >> (2 * c)
                    y[l] = d0 * np.float32((b & 15) | ((h & 1) << 4)) - n0
                    y[32 + l] = d1 * np.float32((b >> 4) | ((h & 2) << 3)) - n1
            else:
                for l in range(L):
                    b = np.int32(qc[l])
                    y[l] = d0 * np.float32(b & 15) - n0
                    y[32 + l] = d1 * np.float32(b >> 4) - n1


@kernel
def _deq_q6_k(row, out, L):
    H = L // 2
    for sb in range(out.shape[0] // 256):
        o = sb * 210
        d = _f16(row, o + 208)
        for h in range(2):
            ql = row[o + 64 * h:o + 64 * h + 64]
            qh = row[o + 128 + 32 * h:o + 160 + 32 * h]
            y = out[sb * 256 + 128 * h:sb * 256 + 128 * h + 128]
            for half in range(2):
                sc = o + 192 + 8 * h + half
                f0, f1 = d * np.float32(np.int8(row[sc])), d * np.float32(np.int8(row[sc + 2]))
                f2, f3 = d * np.float32(np.int8(row[sc + 4])), d * np.float32(np.int8(row[sc + 6]))
                for l in range(H):
                    i = 16 * half + l
                    a, b, hh = np.int32(ql[i]), np.int32(ql[32 + i]), np.int32(qh[i])
                    y[i] = f0 * np.float32(((a & 15) | ((hh & 3) << 4)) - 32)
                    y[32 + i] = f1 * np.float32(((b & 15) | ((hh & 12) << 2)) - 32)
                    y[64 + i] = f2 * np.float32(((a >> 4) | (hh & 48)) - 32)
                    y[96 + i] = f3 * np.float32(((b >> 4) | ((hh >> 2) & 48)) - 32)


@kernel
def _q3_scale(row, s, j):
    low = (np.int32(row[s + j]) & 15) if j < 8 else (np.int32(row[s + j - 8]) >> 4)
    return (low | (((np.int32(row[s + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32


@kernel
def _deq_q3_k(row, out, L):
    H = L // 2
    for sb in range(out.shape[0] // 256):
        o = sb * 110
        hm, d = row[o:o + 32], _f16(row, o + 108)  # high bits, super-block scale
        for h in range(2):
            qs = row[o + 32 + 32 * h:o + 64 + 32 * h]
            for k in range(4):
                y = out[sb * 256 + 128 * h + 32 * k:sb * 256 + 128 * h + 32 * k + 32]
                bit = 4 * h + k
                for half in range(2):
                    f = d * np.float32(_q3_scale(row, o + 96, 8 * h + 2 * k + half))
                    for l in range(H):
                        i = 16 * half + l
                        low = (np.int32(qs[i]) >> (2 * k)) & 3
                        y[i] = f * np.float32(low - 4 + (((np.int32(hm[i]) >> bit) & 1) << 2))


@kernel
def _deq_q2_k(row, out, L):
    H = L // 2
    for sb in range(out.shape[0] // 256):
        o = sb * 84
        d, dmin = _f16(row, o + 80), _f16(row, o + 82)
        for h in range(2):
            qs = row[o + 16 + 32 * h:o + 48 + 32 * h]
            for k in range(4):
                y = out[sb * 256 + 128 * h + 32 * k:sb * 256 + 128 * h + 32 * k + 32]
                for half in range(2):
                    sc = np.int32(row[o + 8 * h + 2 * k + half])
                    f, m = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                    for l in range(H):
                        i = 16 * half + l
                        y[i] = f * np.float32((np.int32(qs[i]) >> (2 * k)) & 3) - m


@kernel
def _deq_q5(row, out, L, one):
    """q5_0 (value d (q - 16)) or, one=True, q5_1 (d q + m)."""
    H = L // 2
    bb, h0 = (24, 4) if one else (22, 2)
    for blk in range(out.shape[0] // 32):
        o = blk * bb
        d = _f16(row, o)
        m = _f16(row, o + 2) if one else np.float32(0.0)
        off = 0 if one else 16
        qh = (np.int64(row[o + h0]) | (np.int64(row[o + h0 + 1]) << 8)
              | (np.int64(row[o + h0 + 2]) << 16) | (np.int64(row[o + h0 + 3]) << 24))
        qs = row[o + h0 + 4:o + bb]
        y = out[32 * blk:32 * blk + 32]
        for j in range(H):
            b = np.int32(qs[j])
            y[j] = d * np.float32(((b & 15) | np.int32(((qh >> j) & 1) << 4)) - off) + m
            y[16 + j] = d * np.float32(((b >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4))
                                       - off) + m


def _deq_case(c: int):
    """by_kind's case: type c's row dequantizer (glue, compiled into its caller)."""
    if c in (Q4_K, Q5_K):
        five = c == Q5_K

        @njit(**GLUE)
        def deq(row, out, L):
            _deq_q45_k(row, out, L, five)
    elif c == Q6_K:
        @njit(**GLUE)
        def deq(row, out, L):
            _deq_q6_k(row, out, L)
    elif c == Q3_K:
        @njit(**GLUE)
        def deq(row, out, L):
            _deq_q3_k(row, out, L)
    elif c == Q2_K:
        @njit(**GLUE)
        def deq(row, out, L):
            _deq_q2_k(row, out, L)
    else:
        one = c == Q5_1

        @njit(**GLUE)
        def deq(row, out, L):
            _deq_q5(row, out, L, one)
    return deq


# (kind, row, out, L): one stored row (uint8 [row_bytes]) -> out float32 [K] (value = dsub q
# - msub), by type code; a kernel compiled for one code (a literal kind) holds only its type's
_dequant = by_kind([Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, Q5_1, Q5_0], _deq_case)


@kernel
def _lanes(K):
    """32, as a value LLVM cannot fold (see the row dequantizers)."""
    return 32 if K > 0 else 0


# --- entry points -------------------------------------------------------------------------

@kernel
def _dot(wf, x, t):
    acc = np.float32(0.0)
    for k in range(wf.shape[0]):
        acc += wf[k] * x[t, k]
    return acc


@kernel
def mvp_rows_k(kind, w, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0]: each row dequantized into L1 scratch, then dotted."""
    K = x.shape[1]
    L = _lanes(K)
    wf = np.empty(K, np.float32)
    for i in range(r0, r1):
        _dequant(kind, w[i], wf, L)
        out[0, i] = _dot(wf, x, 0)


@kernel(parallel=True)
def mvp_k(kind, w, x, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_k(kind, w, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def embed_k(kind, w, ids, out):
    """out[t] = row ids[t] dequantized."""
    L = _lanes(out.shape[1])
    for t in range(ids.shape[0]):
        _dequant(kind, w[ids[t]], out[t], L)


@kernel(parallel=True)
def gemm_k(kind, w, x, out):
    """out[T, N] = x @ W.T on panels of W rows dequantized once (panel_gemm.py's tiles)."""
    N, K = w.shape[0], x.shape[1]
    for g in prange((N + W - 1) // W):
        ids = np.arange(g * W, min(N, g * W + W))
        rows = np.empty((ids.shape[0], K), np.float32)
        embed_k(kind, w, ids, rows)
        if ids.shape[0] == W:
            _group(np.empty((K, W), np.float32), rows, x, out, g * W)
        else:
            _tail(rows, x, out, g * W)
