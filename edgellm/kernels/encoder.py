"""Encoder kernels (BERT family): LayerNorm with bias, exact GELU, bidirectional attention
over packed variable-length sequences.

    add_layernorm(x, y, bias, w, b, eps)     x[T,D] = LN(x + y + bias) * w + b   (post-LN)
    bias_gelu(x, bias)                       x[T,F] = gelu_erf(x + bias)
    packed_attention(q, k, v, offsets, scale, out)
        out[T,H,Dh]: each sequence s (rows offsets[s]..offsets[s+1]-1) attends to its own
        rows only, every query to every key of its sequence (no causal mask, no padding)

Attention with Dh % 16 == 0 (every BERT-family checkpoint) runs each (sequence, head) as
two small GEMMs on panel_gemm.py's float register tiles (scores against the keys as
[Dh, 16] panels, then the weights against the values as [L, 16] panels) with a softmax
whose exp is a degree-6 polynomial (exp_fast, relative error < 3e-7 + 1e-7 |x|, vectorized),
which more than halved attention's share of an embed call. A single sequence (Whisper's
window) is split instead into (head, block of ROWS queries) items, so both threads work on
it. Other Dh
take the row-at-a-time kernel (attention.combine and fastexp's exact exp).

The public functions validate shapes, dtypes and offsets, then call the compiled kernels,
which run with bounds checks off. LayerNorm is transformers' (biased variance, eps inside
the square root); GELU is erf-exact ("gelu" in BERT configs), with erf as a rational
approximation that vectorizes (|error| < 1e-6, tests/test_embed.py checks it).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..codegen.ir import BYTES, F32, _c, _i64, _llvm_fn, _load, _loop, _v
from .attention import combine
from .fastexp import exp_shift
from .jit import kernel
from .panel_gemm import W, tiles

_F32 = np.dtype(np.float32)

# erf(x) ~ x P(x^2) / Q(x^2) on [-4, 4] (Eigen's / XLA's float32 erf), +-1 beyond
_A = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
      -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
      -1.60960333262415e-02)
_B = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
      -7.37332916720468e-03, -1.42647390514189e-02)
A13, A11, A9, A7, A5, A3, A1 = (np.float32(a) for a in _A)
B8, B6, B4, B2, B0 = (np.float32(b) for b in _B)


@kernel
def erf32(x):
    """erf of a float32 (rational approximation, vectorizable)."""
    x = min(max(x, np.float32(-4.0)), np.float32(4.0))
    x2 = x * x
    p = x2 * A13 + A11
    p = x2 * p + A9
    p = x2 * p + A7
    p = x2 * p + A5
    p = x2 * p + A3
    p = x2 * p + A1
    q = x2 * B8 + B6
    q = x2 * q + B4
    q = x2 * q + B2
    q = x2 * q + B0
    return x * p / q


@kernel
def _gelu_row(x, bias):
    half, rsqrt2 = np.float32(0.5), np.float32(0.7071067811865476)
    for i in range(x.shape[0]):
        v = x[i] + bias[i]
        x[i] = half * v * (np.float32(1.0) + erf32(v * rsqrt2))


@kernel(parallel=True)
def _bias_gelu(x, bias):
    for t in prange(x.shape[0]):
        _gelu_row(x[t], bias)


@kernel
def _ln_row(x, y, bias, w, b, eps):
    D = x.shape[0]
    s = np.float32(0.0)
    for i in range(D):
        v = x[i] + y[i] + bias[i]
        x[i] = v
        s += v
    mean = s / np.float32(D)
    ss = np.float32(0.0)
    for i in range(D):
        d = x[i] - mean
        ss += d * d
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(D) + eps)
    for i in range(D):
        x[i] = (x[i] - mean) * inv * w[i] + b[i]


@kernel(parallel=True)
def _add_layernorm(x, y, bias, w, b, eps):
    e = np.float32(eps)
    for t in prange(x.shape[0]):
        _ln_row(x[t], y[t], bias, w, b, e)


@intrinsic
def _bits_f32(typingctx, bits):
    """The int32's bits as a float32."""
    def codegen(ctx, b, sig, args):
        return b.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


LOG2E = np.float32(1.4426950408889634)
# 2^f on [-0.5, 0.5]: Taylor coefficients (ln 2)^k / k!, degree 6 (relative error < 2e-7)
P1, P2, P3, P4, P5, P6 = (np.float32(c) for c in (
    0.6931471805599453, 0.2402265069591007, 0.05550410866482158, 0.009618129107628477,
    0.0013333558146428443, 0.00015403530393381606))


@njit(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, inline="always")
def exp_fast(x):
    """exp of a float32 <= 0 (a softmax's shifted score), relative error < 3e-7 + 1e-7 |x|
    (x log2(e) rounded to float32), 0 below -87: vectorizes under fastmath (no table, no
    libm call), unlike fastexp.exp32.
    Inlined (not cached itself): a cached function would be called, not vectorized."""
    y = max(x * LOG2E, np.float32(-126.0))
    n = np.floor(y + np.float32(0.5))
    f = y - n
    p = f * P6 + P5
    p = f * p + P4
    p = f * p + P3
    p = f * p + P2
    p = f * p + P1
    p = f * p + np.float32(1.0)
    return p * _bits_f32((np.int32(n) + np.int32(127)) << np.int32(23))


@intrinsic
def _max16(typingctx, row, n):
    """The largest of row[:n // 16 * 16] (float32, 1-D, contiguous), -3e38 if n < 16, on
    16-lane maxima: numba's max() of floats keeps NaN's order and does not vectorize."""
    if not (isinstance(row, types.Array) and row.ndim == 1 and row.dtype == types.float32
            and row.layout == "C" and isinstance(n, types.Integer)):
        return None

    def codegen(ctx, b, sig, args):
        base = b.bitcast(ctx.make_array(sig.args[0])(ctx, b, args[0]).data, BYTES)
        v16 = _v(F32, 16)
        vmax = _llvm_fn(b, "llvm.maxnum.v16f32", v16, [v16, v16])
        count = ctx.cast(b, args[1], sig.args[1], types.int64)

        def body(k, st):
            return [b.call(vmax, [st[0], _load(b, base, b.mul(k, _i64(64)), v16)])]
        states = _loop(b, b.sdiv(count, _i64(16)), [_c(v16, [-3.0e38] * 16)], body, unroll=4)
        acc = states[0][0]
        for st in states[1:]:
            acc = b.call(vmax, [acc, st[0]])
        return b.call(_llvm_fn(b, "llvm.vector.reduce.fmax.v16f32", F32, [v16]), [acc])
    return types.float32(row, n), codegen


@njit(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, inline="always")
def row_max(row, n):
    """max(row[:n]) of a contiguous float32 row (-3e38 if n == 0), vectorized (a maximum
    is exact in any order: the same value as the loop's)."""
    best = _max16(row, n)
    for s in range(n // 16 * 16, n):
        best = max(best, row[s])
    return best


@kernel
def _softmax_fast(row, n):
    """row[:n] = exp(row[:n] - max) with exp_fast (the encoders' attention); returns
    1 / their sum, which the caller applies to the weighted sum of values instead."""
    best = row_max(row, n)
    total = np.float32(0.0)
    for s in range(n):
        e = exp_fast(row[s] - best)
        row[s] = e
        total += e
    return np.float32(1.0) / total


@kernel
def softmax_scaled(row, n, scale):
    """row[:n] = softmax(row[:n] * scale), exact (fastexp's exp_shift: libm's expf), the
    sum in float32; also the decoder attention's of seq2seq_attention.py (scale 1)."""
    best = np.float32(-3.0e38)
    for s in range(n):
        row[s] *= scale
        best = max(best, row[s])
    exp_shift(row, n, best)
    total = np.float32(0.0)
    for s in range(n):
        total += row[s]
    inv = np.float32(1.0) / total
    for s in range(n):
        row[s] *= inv


@kernel
def _gather_heads(q, k, v, t0, L, scale, qh, kp, vp):
    """One sequence's rows t0..t0+L-1 of q, k, v [T, H, Dh], read row after row (whole
    rows: a stream the prefetcher follows, where one head's 2 lines a row were as many
    scattered misses), into head-major scratch: qh [H, L, Dh] the scaled queries, kp
    [H, nk, Dh, 16] the keys as panels (zero past L), vp [H, Dh / 16, L, 16] the values
    as panels."""
    H, Dh = q.shape[1], q.shape[2]
    last = kp.shape[1] - 1
    for h in range(H):
        for i in range(Dh):
            for j in range(W):
                kp[h, last, i, j] = np.float32(0.0)
    for r in range(L):
        c, j = r // W, r % W
        for h in range(H):
            for i in range(Dh):
                qh[h, r, i] = q[t0 + r, h, i] * scale
            for i in range(Dh):
                kp[h, c, i, j] = k[t0 + r, h, i]
            for c2 in range(Dh // W):
                for j2 in range(W):
                    vp[h, c2, r, j2] = v[t0 + r, h, c2 * W + j2]


@kernel
def _head_tiles(qh, kp, vp, t0, L, h, scores, oh, out):
    """Head h of one sequence as two small GEMMs on the float panel tiles (panel_gemm.py):
    scores [L, 16 nk] = qh kp (the scaled queries against the key panels); softmax of each
    row's first L; oh [L, Dh] = scores[:, :L] vp; out[t0 + r, h] = oh[r] / (row r's sum
    of exps). qh, kp, vp: _gather_heads' scratch, head h."""
    Dh = qh.shape[1]
    for c in range(kp.shape[0]):
        tiles(kp[c], qh, 0, L, scores, c * W)
    inv = np.empty(L, dtype=np.float32)
    for r in range(L):
        inv[r] = _softmax_fast(scores[r], L)
    for c in range(vp.shape[0]):
        tiles(vp[c], scores, 0, L, oh, c * W)
    for r in range(L):
        for i in range(Dh):
            out[t0 + r, h, i] = oh[r, i] * inv[r]


@kernel(parallel=True)
def _packed_attention_tiles(q, k, v, offsets, scale, out):
    """_packed_attention for Dh % 16 == 0: each sequence's heads gathered at once, then
    each head on register tiles."""
    T, H, Dh = q.shape
    n_seq = offsets.shape[0] - 1
    sc = np.float32(scale)
    for s in prange(n_seq):
        t0, L = offsets[s], offsets[s + 1] - offsets[s]
        nk = (L + W - 1) // W
        qh = np.empty((H, L, Dh), dtype=np.float32)
        kp = np.empty((H, nk, Dh, W), dtype=np.float32)
        vp = np.empty((H, Dh // W, L, W), dtype=np.float32)
        _gather_heads(q, k, v, t0, L, sc, qh, kp, vp)
        scores = np.empty((L, nk * W), dtype=np.float32)
        oh = np.empty((L, Dh), dtype=np.float32)
        for h in range(H):
            _head_tiles(qh[h], kp[h], vp[h], t0, L, h, scores, oh, out)


ROWS = 48  # queries per work item of one long sequence: scores [48, L] stay in L2 at L 1,500


@kernel(parallel=True)
def _gather_one(q, k, v, scale, qh, kp, vp):
    """_gather_heads of a single sequence, its rows in parallel blocks of W (a key panel's)."""
    T, H, Dh = q.shape
    nk = kp.shape[1]
    for c in prange(nk):
        for r in range(c * W, min(T, c * W + W)):
            j = r % W
            for h in range(H):
                for i in range(Dh):
                    qh[h, r, i] = q[r, h, i] * scale
                for i in range(Dh):
                    kp[h, c, i, j] = k[r, h, i]
                for c2 in range(Dh // W):
                    for j2 in range(W):
                        vp[h, c2, r, j2] = v[r, h, c2 * W + j2]
        if c == nk - 1:
            for r in range(T, nk * W):  # the last panel's columns past T: zero keys
                for h in range(H):
                    for i in range(Dh):
                        kp[h, c, i, r % W] = np.float32(0.0)


@kernel(parallel=True)
def _one_sequence_tiles(q, k, v, scale, out):
    """_packed_attention_tiles of a single sequence (an audio window's 1,500 frames): its
    (head, block of ROWS queries) pairs in parallel, each on the same tiles and softmax as
    _head_tiles, so every row's result is the same; a block's scores stay in cache where a
    head's [L, L] would not."""
    T, H, Dh = q.shape
    nk = (T + W - 1) // W
    qh = np.empty((H, T, Dh), dtype=np.float32)
    kp = np.empty((H, nk, Dh, W), dtype=np.float32)
    vp = np.empty((H, Dh // W, T, W), dtype=np.float32)
    _gather_one(q, k, v, np.float32(scale), qh, kp, vp)
    nb = (T + ROWS - 1) // ROWS
    for item in prange(H * nb):
        h, r0 = item // nb, (item % nb) * ROWS
        n = min(T, r0 + ROWS) - r0
        qc = np.empty((n, Dh), dtype=np.float32)
        for r in range(n):
            for i in range(Dh):
                qc[r, i] = qh[h, r0 + r, i]
        scores = np.empty((n, nk * W), dtype=np.float32)
        for c in range(nk):
            tiles(kp[h, c], qc, 0, n, scores, c * W)
        inv = np.empty(n, dtype=np.float32)
        for r in range(n):
            inv[r] = _softmax_fast(scores[r], T)
        oh = np.empty((n, Dh), dtype=np.float32)
        for c in range(Dh // W):
            tiles(vp[h, c], scores, 0, n, oh, c * W)
        for r in range(n):
            for i in range(Dh):
                out[r0 + r, h, i] = oh[r, i] * inv[r]


@kernel(parallel=True)
def _packed_attention(q, k, v, offsets, scale, out):
    T, H, Dh = q.shape
    n_seq = offsets.shape[0] - 1
    sc = np.float32(scale)
    for item in prange(n_seq * H):
        s, h = item // H, item % H
        t0, t1 = offsets[s], offsets[s + 1]
        L = t1 - t0
        kt = np.empty((Dh, L), dtype=np.float32)  # keys transposed: long score loops
        vals = np.empty((L, Dh), dtype=np.float32)
        for j in range(L):
            for i in range(Dh):
                kt[i, j] = k[t0 + j, h, i]
                vals[j, i] = v[t0 + j, h, i]
        row = np.empty(L, dtype=np.float32)
        for t in range(t0, t1):
            combine(q[t, h], Dh, kt, row)  # row[j] = q_t . k_j
            softmax_scaled(row, L, sc)
            combine(row, L, vals, out[t, h])


# --- validation, then one kernel call ---------------------------------------------------

def _f32(a, ndim: int, what: str, writeable: bool = False) -> None:
    if not isinstance(a, np.ndarray) or a.dtype != _F32 or a.ndim != ndim \
            or not a.flags.c_contiguous:
        desc = f"{a.dtype} {a.ndim}-D" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{what} must be a C-contiguous {ndim}-D float32 array, got {desc}")
    if writeable and not a.flags.writeable:
        raise ValueError(f"{what} is read-only")


def add_layernorm(x: np.ndarray, y: np.ndarray, bias: np.ndarray, w: np.ndarray,
                  b: np.ndarray, eps: float) -> None:
    """x[T, D] = LayerNorm(x + y + bias) * w + b, in place (y [T, D]; bias, w, b [D])."""
    _f32(x, 2, "x", writeable=True)
    _f32(y, 2, "y")
    if y.shape != x.shape:
        raise ValueError(f"y {list(y.shape)} must match x {list(x.shape)}")
    for name, vec in (("bias", bias), ("w", w), ("b", b)):
        _f32(vec, 1, name)
        if vec.shape[0] != x.shape[1]:
            raise ValueError(f"{name} has {vec.shape[0]} values, x has {x.shape[1]} columns")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if x.shape[0]:
        _add_layernorm(x, y, bias, w, b, float(eps))


def bias_gelu(x: np.ndarray, bias: np.ndarray) -> None:
    """x[T, F] = gelu(x + bias[F]) in place, GELU with the exact erf."""
    _f32(x, 2, "x", writeable=True)
    _f32(bias, 1, "bias")
    if bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias has {bias.shape[0]} values, x has {x.shape[1]} columns")
    if x.shape[0]:
        _bias_gelu(x, bias)


def packed_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, offsets: np.ndarray,
                     scale: float, out: np.ndarray) -> None:
    """out[T, H, Dh] = softmax(q k^T * scale) v within each sequence of the packed batch.

    q, k, v: float32 [T, H, Dh] (each a C-contiguous array or a reshaped row block);
    offsets: int64 [n + 1], 0 = offsets[0] < offsets[1] < ... < offsets[n] = T.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        _f32(a, 3, name)
    _f32(out, 3, "out", writeable=True)
    if not (q.shape == k.shape == v.shape == out.shape):
        raise ValueError(f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} and out "
                         f"{list(out.shape)} must have one shape")
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or offsets.dtype != np.int64 or offsets.size < 2:
        raise ValueError("offsets must be a 1-D int64 array of at least 2 values")
    if offsets[0] != 0 or offsets[-1] != q.shape[0] or np.any(np.diff(offsets) <= 0):
        raise ValueError(f"offsets must rise strictly from 0 to T={q.shape[0]}, got "
                         f"{offsets[:4].tolist()}...{offsets[-1]}")
    if np.may_share_memory(out, q) or np.may_share_memory(out, k) \
            or np.may_share_memory(out, v):
        raise ValueError("out overlaps q, k or v")
    if q.shape[2] % W:
        _packed_attention(q, k, v, np.ascontiguousarray(offsets), float(scale), out)
    elif offsets.size == 2:  # one sequence: its heads and blocks of queries in parallel
        _one_sequence_tiles(q, k, v, float(scale), out)
    else:
        _packed_attention_tiles(q, k, v, np.ascontiguousarray(offsets), float(scale), out)
