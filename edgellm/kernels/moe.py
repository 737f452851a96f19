"""Mixture-of-experts helpers: top-k routing and the weighted scatter of expert outputs."""

import numpy as np
from numba import njit

from ..runtime import numba_setup  # noqa: F401

OPT = dict(fastmath=False, boundscheck=False, error_model="numpy", nogil=True, cache=True)


@njit(**OPT)
def route(logits, k, renorm, idx, weights):
    """Top-k routing of router logits [T, E].

    idx int64 [T, k] = the k experts of largest softmax probability, best first (ties: the
    lower id); weights float32 [T, k] = their probabilities, divided by their sum if renorm.
    The softmax is over all E experts (computed in float64).
    """
    T, E = logits.shape
    for t in range(T):
        best = -np.inf
        for e in range(E):
            best = max(best, np.float64(logits[t, e]))
        total = 0.0
        for e in range(E):
            total += np.exp(np.float64(logits[t, e]) - best)
        kept = 0.0
        for j in range(k):
            pick = -1
            for e in range(E):
                taken = False
                for jj in range(j):
                    taken = taken or idx[t, jj] == e
                if not taken and (pick < 0 or logits[t, e] > logits[t, pick]):
                    pick = e
            idx[t, j] = pick
            p = np.exp(np.float64(logits[t, pick]) - best) / total
            weights[t, j] = p
            kept += p
        if renorm:
            for j in range(k):
                weights[t, j] = np.float32(np.float64(weights[t, j]) / kept)


@njit(**OPT)
def scatter_add(out, rows, weights, y):
    """out[rows[i], :] += weights[i] * y[i, :] for i < len(rows) (out [T, D], y [n, D])."""
    n, D = y.shape
    for i in range(n):
        r = rows[i]
        w = weights[i]
        for d in range(D):
            out[r, d] += w * y[i, d]
