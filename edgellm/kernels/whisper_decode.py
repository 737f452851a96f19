"""The small per-token kernels of Whisper's decoder: the logit rules and one row's LayerNorm.

    logit_rules(rows, history, k, rules, idx, logp)
        rows float32 [B, V] (each sequence's logits, filtered in place), history int64
        [B, n] (the tokens each sequence generated so far), rules int64 [8] (RULES'
        fields): openai/whisper's logit filters (begin-suppressed tokens at the first step,
        suppressed tokens, ApplyTimestampRules), then idx [B, k] the k largest entries'
        tokens, largest first, ties by index (a stable argsort's first k), and logp [B, k]
        their log-probabilities (the entry minus the row's log-sum-exp)
    layernorm_rows(x, w, b, eps, out)
        out [T, D] = (x - mean) / sqrt(var + eps) * w + b per row, float32, with the bits of
        numpy's expression (its pairwise sums: sum_pairwise), for the few rows of a step

These replace numpy code that ran once per token over the 51,865-entry vocabulary in float64
(a copy of the row, the suppressions, two log-sum-exps, an argmax or a partition): each a
pass over the row and a new array. Here the masks are written into the float32 logits, the
exps are fastexp's (libm's expf bits, vectorized) and summed in float64: the log-sum-exp
agrees with the float64 one to ~1e-7, and the order of the entries (the tokens chosen) is
the float32 row's, as it was. The timestamp rule compares the timestamps' total probability
with the most likely text token's, as openai/whisper does, from the same two sums.
"""

from __future__ import annotations

import math

import numpy as np

from .fastexp import exp_shift
from .jit import kernel

NEG = np.float32(-np.inf)
# rules' fields: flags (bit 0: timestamps), the token ids the rules name, the first
# timestamp's highest index, then the lengths of the two suppress lists appended after
RULES = ("flags", "no_timestamps", "timestamp_begin", "eot", "max_initial")


@kernel
def _sum64(e, lo, hi):
    """sum(e[lo:hi]) in float64 (fastmath: vectorized lanes)."""
    s = 0.0
    for i in range(lo, hi):
        s += np.float64(e[i])
    return s


@kernel
def _max32(x, lo, hi):
    """max(x[lo:hi]) (-inf if empty; fastmath: vectorized, x holds no NaN)."""
    m = NEG
    for i in range(lo, hi):
        m = max(m, x[i])
    return m


@kernel(exact=True)
def _filter_row(row, hist, n, rules, suppress, begin_suppress):
    """One row's suppressions and timestamp rules up to the choice between text and
    timestamps (transcribe.py's Transcriber.filters is the numpy statement of them)."""
    V = row.shape[0]
    flags, no_ts, begin, eot, max_initial = rules[0], rules[1], rules[2], rules[3], rules[4]
    if n == 0:
        for i in begin_suppress:
            row[i] = NEG
    for i in suppress:
        row[i] = NEG
    if not flags & 1:
        return
    row[no_ts] = NEG
    last = n >= 1 and hist[n - 1] >= begin
    penultimate = n < 2 or hist[n - 2] >= begin
    if last:  # timestamps come in pairs, except right before the end
        if penultimate:
            for i in range(begin, V):
                row[i] = NEG
        else:
            for i in range(eot):
                row[i] = NEG
    stamp = -1
    for j in range(n):
        if hist[j] >= begin:
            stamp = hist[j]
    if stamp >= 0:  # never decreasing, and a segment never of zero length
        hi = stamp if last and not penultimate else stamp + 1
        for i in range(begin, hi):
            row[i] = NEG
    if n == 0:  # a window starts with a timestamp, within the first second
        for i in range(begin):
            row[i] = NEG
        for i in range(begin + max_initial + 1, V):
            row[i] = NEG


@kernel(exact=True)
def _top(row, k, idx):
    """idx[:k] = the k largest entries' indices, largest first, ties by index."""
    vals = np.empty(k, np.float32)
    cnt = 0
    for i in range(row.shape[0]):
        v = row[i]
        if cnt == k and not v > vals[k - 1]:
            continue
        pos = cnt if cnt < k else k - 1
        while pos > 0 and vals[pos - 1] < v:  # an equal one keeps its place: ties by index
            if pos < k:
                vals[pos], idx[pos] = vals[pos - 1], idx[pos - 1]
            pos -= 1
        vals[pos], idx[pos] = v, i
        cnt = min(cnt + 1, k)


@kernel(exact=True)
def _rules_rows(rows, hist, n, rules, suppress, begin_suppress, k, scratch, idx, logp):
    B, V = rows.shape
    begin = rules[2]
    for b in range(B):
        row = rows[b]
        _filter_row(row, hist[b], n, rules, suppress, begin_suppress)
        best_text = _max32(row, 0, begin)
        top = max(best_text, _max32(row, begin, V))
        scratch[:] = row
        exp_shift(scratch, V, top)  # exp(x - max), 0 for -inf
        text, stamps = _sum64(scratch, 0, begin), _sum64(scratch, begin, V)
        lse = np.float64(top) + math.log(text + stamps) if top > NEG else -np.inf
        if rules[0] & 1 and top > NEG:
            # log P(any timestamp) > log P(the most likely text token): take a timestamp
            if np.float64(top) + math.log(stamps) - lse > np.float64(best_text) - lse:
                for i in range(begin):
                    row[i] = NEG
                lse = np.float64(top) + math.log(stamps)
        _top(row, k, idx[b])
        for r in range(k):
            logp[b, r] = np.float64(row[idx[b, r]]) - lse


def logit_rules(rows: np.ndarray, history: np.ndarray, k: int, rules: np.ndarray,
                suppress: np.ndarray, begin_suppress: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """(idx [B, k] int64, logp [B, k] float64) after filtering rows [B, V] in place (the
    module docstring); history [B, n] int64."""
    B, V = rows.shape
    assert rows.dtype == np.float32 and rows.flags.c_contiguous and history.shape[0] == B
    assert 1 <= k <= V and history.dtype == np.int64 and history.flags.c_contiguous
    idx = np.empty((B, k), np.int64)
    logp = np.empty((B, k), np.float64)
    _rules_rows(rows, history, history.shape[1], rules, suppress, begin_suppress, k,
                np.empty(V, np.float32), idx, logp)
    return idx, logp


@kernel(exact=True)
def sum_pairwise(a):
    """numpy's float32 sum of a 1-D contiguous array, bit for bit (its pairwise_sum: eight
    accumulators over blocks of at most 128, halves above)."""
    n = a.shape[0]
    if n < 8:
        s = np.float32(0.0)
        for i in range(n):
            s += a[i]
        return s
    if n <= 128:
        r0, r1, r2, r3 = a[0], a[1], a[2], a[3]
        r4, r5, r6, r7 = a[4], a[5], a[6], a[7]
        i = 8
        while i < n - n % 8:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            s += a[i]
            i += 1
        return s
    n2 = n // 2
    n2 -= n2 % 8
    return sum_pairwise(a[:n2]) + sum_pairwise(a[n2:])


@kernel(exact=True)
def _layernorm(x, w, b, eps, out, d):
    T, D = x.shape
    for t in range(T):  # numpy's mean: the float32 sum divided by the count in float64
        mean = np.float32(np.float64(sum_pairwise(x[t])) / D)
        for i in range(D):
            d[i] = x[t, i] - mean
        for i in range(D):
            out[t, i] = d[i] * d[i]
        var = np.float32(np.float64(sum_pairwise(out[t])) / D)
        s = np.float32(math.sqrt(var + eps))
        for i in range(D):
            out[t, i] = d[i] / s * w[i] + b[i]


def layernorm_rows(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float,
                   out: np.ndarray) -> np.ndarray:
    """out [T, D] = LayerNorm(x) * w + b (module docstring); returns out."""
    _layernorm(x, w, b, np.float32(eps), out, np.empty(x.shape[1], np.float32))
    return out
