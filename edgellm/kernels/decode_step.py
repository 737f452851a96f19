"""One decode step of a llama-family model in one parallel region.

Python calls `decode_token` once per generated token. Inside, `n_threads` workers (one per
prange iteration) run the whole step: each splits the rows of every matrix with the others
and they meet at spin barriers (sync.py) where a stage needs the previous one's full
output. Per layer, for worker `tid`:

  S1  h = rmsnorm(x); quantize h (int8 mode)            private copy: no barrier needed
  S2  rows of q, k, v (+ biases)                         -> shared q, k, v      | barrier
  S3  its query heads, one KV group at a time (each cached k, v row read once for the
      group): q/k norm, RoPE, attention over the cache plus this token;
      the worker owning a KV head's first query head stores its k, v            | barrier
  S4  quantize attn (private); rows of o_proj: x[r] += o[r]                     | barrier
  S5  h = rmsnorm(x) (private); rows of gate and up: ffn[r] = silu(g[r]) u[r]   | barrier
  S6  quantize ffn (private); rows of down_proj: x[r] += d[r]                   | barrier
then the final norm and the rows of the output head. Weights are read in place from the
mapped file (`blob`, a uint8 view of the whole file) at offsets from `mats`.

Every offset, shape and type in the tables is checked by the caller (arch/fused.py)
before the first call: these kernels do not check bounds.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import quant
from .act_quant import quantize_rows
from .activations import swiglu_row
from .dots import LANES, dots16
from .fastexp import MASKED, exp_shift
from .matvec import (
    mv_rows_q4_0,
    mv_rows_q4_1,
    mv_rows_q8_0,
    mvp_rows_q4_0,
    mvp_rows_q4_1,
    mvp_rows_q8_0,
)
from .jit import kernel
from .sync import barrier

# @kernel caches under a tag that covers the kernel modules these functions call
# (numba's own cache key would only see this file).
KIND_CODE = {n: quant.TYPES[n].code for n in quant.INT8_TYPES}  # q8_0 2, q4_0 3, q4_1 4
# mats[layer, m] = (offset, rows, row_bytes, kind, block) for m in Q..DOWN
Q, K, V, O, GATE, UP, DOWN = range(7)
ALIGN = 16  # row split granularity (cache-line friendly, whole prefill tiles)


@kernel
def _split(n, tid, nt):
    """Rows [r0, r1) of n for worker tid of nt, boundaries on ALIGN."""
    per = (n + nt * ALIGN - 1) // (nt * ALIGN) * ALIGN
    r0 = min(n, tid * per)
    return r0, min(n, r0 + per)


@kernel
def _matrix(blob, m):
    """The uint8 [rows, row_bytes] view of table entry m."""
    off, rows, rb = m[0], m[1], m[2]
    return blob[off:off + rows * rb].reshape((rows, rb))


@kernel
def _mv(blob, m, h, xq, xd, xds, out, r0, r1, precise):
    """out[0, r0:r1] = W[r0:r1] @ h[0] for the matrix of table entry m."""
    w = _matrix(blob, m)
    kind, block = m[3], m[4]
    if precise:
        if kind == 2:
            mvp_rows_q8_0(w, block, h, out, r0, r1)
        elif kind == 3:
            mvp_rows_q4_0(w, block, h, out, r0, r1)
        else:
            mvp_rows_q4_1(w, block, h, out, r0, r1)
    else:
        if kind == 2:
            mv_rows_q8_0(w, block, xq, xd, xds, out, r0, r1)
        elif kind == 3:
            mv_rows_q4_0(w, block, xq, xd, xds, out, r0, r1)
        else:
            mv_rows_q4_1(w, block, xq, xd, xds, out, r0, r1)


@kernel
def _rmsnorm(x, w, eps, offset, out):
    """out[0] = x[0] / rms(x[0]) * (w + offset)."""
    D = x.shape[1]
    ss = np.float32(0.0)
    for i in range(D):
        ss += x[0, i] * x[0, i]
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(D) + np.float32(eps))
    for i in range(D):
        out[0, i] = x[0, i] * inv * (w[i] + np.float32(offset))


@kernel
def _head_prep(src, dst, norm_w, has_norm, eps, offset, cos, sin):
    """dst[:] = rope(norm(src)) for one head vector."""
    Dh = src.shape[0]
    if has_norm:
        ss = np.float32(0.0)
        for i in range(Dh):
            ss += src[i] * src[i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(Dh) + np.float32(eps))
        for i in range(Dh):
            dst[i] = src[i] * inv * (norm_w[i] + np.float32(offset))
    else:
        for i in range(Dh):
            dst[i] = src[i]
    half = Dh // 2
    for i in range(half):
        a = dst[i]
        b = dst[i + half]
        dst[i] = a * cos[i] - b * sin[i]
        dst[i + half] = b * cos[i] + a * sin[i]


NEG = MASKED  # the score of a slot a query does not see


@kernel
def _attend_group(qg, ng, kh, vh, kc, vc, cpos, kvh, p, window, scale, scores, stats, out,
                  hq0):
    """Attention of query heads qg[:ng] (heads hq0.. of one KV group, kvh) over the cache
    slots (positions < p in the window) and this token (key kh, value vh).

    Scores 16 cached keys at a time per head (dots16: no horizontal sum per key); the
    weighted values are summed four rows per pass and normalized at the end.
    Scratch: scores [>= ng, >= slots], stats [1, >= ng]. out [1, Hq * Dh] receives the ng
    heads' rows.
    """
    n, Dh = kc.shape[0], kh.shape[0]
    self_s = stats[0]
    keys = kc[:, kvh]  # [n, Dh], rows strided
    for g in range(ng):
        acc = np.float32(0.0)
        for i in range(Dh):
            acc += qg[g, i] * kh[i]
        self_s[g] = acc * scale
    s = 0
    if Dh % LANES == 0:
        while s + LANES <= n:
            for g in range(ng):
                dots16(keys, s, qg, g, scores, s, scale)
            s += LANES
    for t in range(s, n):
        kr = keys[t]
        for g in range(ng):
            acc = np.float32(0.0)
            for i in range(Dh):
                acc += qg[g, i] * kr[i]
            scores[g, t] = acc * scale
    for t in range(n):  # slots this token does not see
        kp = cpos[t]
        if not (kp >= 0 and kp < p and (window == 0 or p - kp < window)):
            for g in range(ng):
                scores[g, t] = NEG
    for g in range(ng):
        row = scores[g]
        best = self_s[g]
        for t in range(n):
            best = max(best, row[t])
        e_self = np.exp(self_s[g] - best)  # one per head: libm
        exp_shift(row, n, best)
        total = e_self
        for t in range(n):
            total += row[t]
        inv = np.float32(1.0) / total
        o = out[0, (hq0 + g) * Dh:(hq0 + g + 1) * Dh]
        for i in range(Dh):
            o[i] = e_self * vh[i]
        t = 0
        while t + 4 <= n:  # four value rows per pass over o
            w0, w1, w2, w3 = row[t], row[t + 1], row[t + 2], row[t + 3]
            v0, v1, v2, v3 = vc[t, kvh], vc[t + 1, kvh], vc[t + 2, kvh], vc[t + 3, kvh]
            for i in range(Dh):
                o[i] += w0 * v0[i] + w1 * v1[i] + w2 * v2[i] + w3 * v3[i]
            t += 4
        while t < n:
            w0, v0 = row[t], vc[t, kvh]
            for i in range(Dh):
                o[i] += w0 * v0[i]
            t += 1
        for i in range(Dh):
            o[i] *= inv


@kernel
def _proj(blob, m, bias, has_bias, h, xq, xd, xds, out, tid, nt, precise):
    """This worker's rows of out[0] = W @ h[0] (+ bias)."""
    r0, r1 = _split(m[1], tid, nt)
    _mv(blob, m, h, xq, xd, xds, out, r0, r1, precise)
    if has_bias:
        for r in range(r0, r1):
            out[0, r] += bias[r]


@kernel
def _store_kv(k, v, kc, vc, cpos, kvh, s, p, Dh, norm_w, has_norm, eps, offset, cos, sin):
    """Write KV head kvh of this token (k normed and roped) into cache slot s."""
    _head_prep(k[0, kvh * Dh:(kvh + 1) * Dh], kc[s, kvh], norm_w, has_norm, eps, offset,
               cos, sin)
    for i in range(Dh):
        vc[s, kvh, i] = v[0, kvh * Dh + i]
    if kvh == 0:
        cpos[s] = p


@kernel
def _worker(tid, nt, blob, mats, head_mat, norms, final_norm, biases, has_bias, qk_norms,
            has_qk_norm, Dh, eps, offset, precise, cos, sin, k_cache, v_cache, cache_pos, caps,
            windows, slots, nslots, p, scale, x, q, k, v, attn, gate, ffn, tmp, logits, h,
            acts_d, acts_q, acts_f, kq, scores, state):
    """Worker tid's part of one decode step (see the module docstring)."""
    xq_d, xd_d, xs_d, xds_d = acts_d
    xq_q, xd_q, xs_q, xds_q = acts_q
    xq_f, xd_f, xs_f, xds_f = acts_f
    L = mats.shape[0]
    Hq = q.shape[1] // Dh
    group = Hq // (k.shape[1] // Dh)
    ht = h[tid:tid + 1]
    aq, ad, asum, ads = xq_d[tid:tid + 1], xd_d[tid:tid + 1], xs_d[tid:tid + 1], xds_d[tid:tid + 1]
    oq, od, osum, ods = xq_q[tid:tid + 1], xd_q[tid:tid + 1], xs_q[tid:tid + 1], xds_q[tid:tid + 1]
    fq, fd, fsum, fds = xq_f[tid:tid + 1], xd_f[tid:tid + 1], xs_f[tid:tid + 1], xds_f[tid:tid + 1]
    h0, h1 = _heads(Hq, tid, nt)
    kbuf, qbuf = kq[tid, 0], kq[tid, 1:]
    for layer in range(L):
        m = mats[layer]
        # S1-S2: rows of q, k, v
        _rmsnorm(x, norms[layer, 0], eps, offset, ht)
        if not precise:
            quantize_rows(ht, aq, ad, asum, ads, 0, 1)
        _proj(blob, m[Q], biases[layer, 0], has_bias, ht, aq, ad, ads, q, tid, nt, precise)
        _proj(blob, m[K], biases[layer, 1], has_bias, ht, aq, ad, ads, k, tid, nt, precise)
        _proj(blob, m[V], biases[layer, 2], has_bias, ht, aq, ad, ads, v, tid, nt, precise)
        barrier(state, nt)
        # S3: attention for query heads h0..h1 over the cache plus this token
        cap = caps[layer]
        n = nslots[layer]  # slots written so far; attention skips the empty rest
        kc, vc, cpos = k_cache[layer, :cap], v_cache[layer, :cap], cache_pos[layer, :cap]
        hq = h0
        while hq < h1:  # the heads of one KV group at a time
            kvh = hq // group
            ng = min(h1, (kvh + 1) * group) - hq
            _head_prep(k[0, kvh * Dh:(kvh + 1) * Dh], kbuf, qk_norms[layer, 1], has_qk_norm,
                       eps, offset, cos, sin)
            for g in range(ng):
                _head_prep(q[0, (hq + g) * Dh:(hq + g + 1) * Dh], qbuf[g], qk_norms[layer, 0],
                           has_qk_norm, eps, offset, cos, sin)
            _attend_group(qbuf, ng, kbuf, v[0, kvh * Dh:(kvh + 1) * Dh], kc[:n], vc[:n],
                          cpos[:n], kvh, p, windows[layer], scale, scores[tid, :group],
                          scores[tid, group:], attn, hq)
            hq += ng
        barrier(state, nt)
        for hq in range(h0, h1):  # the worker with a KV head's first query head stores it
            if hq % group == 0:
                _store_kv(k, v, kc, vc, cpos, hq // group, slots[layer], p, Dh,
                          qk_norms[layer, 1], has_qk_norm, eps, offset, cos, sin)
        # S4: rows of o_proj, residual
        if not precise:
            quantize_rows(attn, oq, od, osum, ods, 0, 1)
        r0, r1 = _split(m[O, 1], tid, nt)
        _mv(blob, m[O], attn, oq, od, ods, tmp, r0, r1, precise)
        for r in range(r0, r1):
            x[0, r] += tmp[0, r]
        barrier(state, nt)
        # S5: rows of gate and up, SwiGLU
        _rmsnorm(x, norms[layer, 1], eps, offset, ht)
        if not precise:
            quantize_rows(ht, aq, ad, asum, ads, 0, 1)
        r0, r1 = _split(m[GATE, 1], tid, nt)
        _mv(blob, m[GATE], ht, aq, ad, ads, gate, r0, r1, precise)
        _mv(blob, m[UP], ht, aq, ad, ads, ffn, r0, r1, precise)
        swiglu_row(gate[0, r0:r1], ffn[0, r0:r1], ffn[0, r0:r1])
        barrier(state, nt)
        # S6: rows of down_proj, residual
        if not precise:
            quantize_rows(ffn, fq, fd, fsum, fds, 0, 1)
        r0, r1 = _split(m[DOWN, 1], tid, nt)
        _mv(blob, m[DOWN], ffn, fq, fd, fds, tmp, r0, r1, precise)
        for r in range(r0, r1):
            x[0, r] += tmp[0, r]
        barrier(state, nt)
    # output head
    _rmsnorm(x, final_norm, eps, offset, ht)
    if not precise:
        quantize_rows(ht, aq, ad, asum, ads, 0, 1)
    r0, r1 = _split(head_mat[1], tid, nt)
    _mv(blob, head_mat, ht, aq, ad, ads, logits, r0, r1, precise)


@kernel
def _heads(n, tid, nt):
    """Heads [h0, h1) of n for worker tid (no alignment)."""
    per = (n + nt - 1) // nt
    h0 = min(n, tid * per)
    return h0, min(n, h0 + per)


@kernel(parallel=True)
def decode_parallel(nt, blob, mats, head_mat, norms, final_norm, biases, has_bias, qk_norms,
                    has_qk_norm, Dh, eps, offset, precise, cos, sin, k_cache, v_cache,
                    cache_pos, caps, windows, slots, nslots, p, scale, x, q, k, v, attn, gate,
                    ffn, tmp, logits, h, acts_d, acts_q, acts_f, kq, scores, state):
    """One decode step on nt threads (nt == numba.get_num_threads(), omp layer)."""
    for tid in prange(nt):
        _worker(tid, nt, blob, mats, head_mat, norms, final_norm, biases, has_bias, qk_norms,
                has_qk_norm, Dh, eps, offset, precise, cos, sin, k_cache, v_cache, cache_pos,
                caps, windows, slots, nslots, p, scale, x, q, k, v, attn, gate, ffn, tmp,
                logits, h, acts_d, acts_q, acts_f, kq, scores, state)


@kernel
def decode_serial(blob, mats, head_mat, norms, final_norm, biases, has_bias, qk_norms,
                  has_qk_norm, Dh, eps, offset, precise, cos, sin, k_cache, v_cache, cache_pos,
                  caps, windows, slots, nslots, p, scale, x, q, k, v, attn, gate, ffn, tmp,
                  logits, h, acts_d, acts_q, acts_f, kq, scores, state):
    """One decode step on the calling thread."""
    _worker(0, 1, blob, mats, head_mat, norms, final_norm, biases, has_bias, qk_norms,
            has_qk_norm, Dh, eps, offset, precise, cos, sin, k_cache, v_cache, cache_pos, caps,
            windows, slots, nslots, p, scale, x, q, k, v, attn, gate, ffn, tmp, logits, h,
            acts_d, acts_q, acts_f, kq, scores, state)
