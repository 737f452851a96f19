"""Beam search and best-of-n sampling over one Whisper window, as openai/whisper's
decoding.py does them (BeamSearchDecoder, GreedyDecoder at a temperature,
MaximumLikelihoodRanker).

Both take the logits after the prompt (`first` [vocab]: the prompt is prefilled once and its
cache copied to every sequence), `step(ids [n]) -> logits [n, vocab]` (one token per
sequence, the n sequences at the same position) and `reorder(source)` (sequence b continues
sequence source[b]: the self-attention cache rows follow). The suppressed tokens and the
timestamp rules: beam search's `rules(rows [n, vocab] float32, history [n, i], k)` filters
the rows in place and gives each row's k best tokens and their log-probabilities
(Transcriber.rules: one kernel); sampling's `filters(row, tokens)` works on one float64 row
in place. They return (tokens without the end token, the sum of their and its
log-probabilities).

    beam search: each beam's beam_size + 1 best next tokens scored by the summed
        log-probability; the beam_size best unfinished candidates go on (a candidate met
        twice, as every beam's at the first step, counts once); ending ones are kept until
        round(beam_size * patience) have ended (or max_new_tokens); too few: the best
        unfinished beams end there.
    sampling: n sequences each drawing from softmax(logits / temperature); a finished one
        keeps taking the end token (so the batch stays aligned); the log-probabilities are
        of the untempered logits.
    ranking: the candidate with the highest sum / length (length_penalty None) or sum /
        ((5 + length) / 6) ** length_penalty (Google NMT's), length without the end token.
"""

from __future__ import annotations

import numpy as np


def log_softmax(row: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of a logits row whose suppressed entries are -inf."""
    top = row.max()
    if top == -np.inf:
        return row.copy()
    return row - (top + np.log(np.exp(row - top).sum()))


def rank(candidates: list[tuple[tuple[int, ...], float]], length_penalty: float | None
         ) -> tuple[list[int], float]:
    """The best (tokens, sum of log-probabilities) by length-normalized sum."""
    def score(c):
        n = max(len(c[0]), 1)
        return c[1] / (n if length_penalty is None else ((5 + n) / 6) ** length_penalty)

    best = max(range(len(candidates)), key=lambda i: score(candidates[i]))  # first of ties
    return list(candidates[best][0]), float(candidates[best][1])


def beam_search(first: np.ndarray, step, reorder, rules, eot: int, beam_size: int,
                patience: float, max_new_tokens: int, length_penalty: float | None = None
                ) -> tuple[list[int], float]:
    max_candidates = max(1, round(beam_size * patience))
    k = beam_size + 1
    beams: list[tuple[int, ...]] = [()]  # every beam is the empty one at first: once
    sums = np.zeros(1)
    rows = np.ascontiguousarray(first[None], np.float32)
    finished: dict[tuple[int, ...], float] = {}
    for i in range(max_new_tokens):
        idx, logp = rules(rows[:len(beams)], np.array(beams, np.int64).reshape(len(beams), i),
                          k)
        scores = (sums[:, None] + logp).ravel()  # beam j's candidates at j k .. j k + k - 1
        kept, source, kept_sums, ended = [], [], [], {}
        for c in np.argsort(-scores, kind="stable").tolist():  # best first, ties in order
            j, tok = c // k, int(idx.flat[c])
            seq = beams[j] + (tok,)
            if tok == eot:
                ended[seq] = float(scores[c])
            else:
                kept.append(seq)
                source.append(j)
                kept_sums.append(scores[c])
                if len(kept) == beam_size:
                    break
        for seq in sorted(ended, key=ended.get, reverse=True):
            if len(finished) >= max_candidates:
                break
            finished[seq] = ended[seq]
        beams, sums = kept, np.array(kept_sums)
        if len(finished) >= max_candidates or i + 1 == max_new_tokens:
            break
        reorder(source)
        rows = step([s[-1] for s in beams])
    if len(finished) < beam_size:  # the best unfinished beams end here
        for j in np.argsort(-sums, kind="stable"):
            finished[beams[j] + (eot,)] = float(sums[j])
            if len(finished) >= beam_size:
                break
    return rank([(s[:s.index(eot)], lp) for s, lp in finished.items()], length_penalty)


def sample(first: np.ndarray, step, filters, eot: int, n: int, temperature: float,
           max_new_tokens: int, rng: np.random.Generator,
           length_penalty: float | None = None) -> tuple[list[int], float]:
    tokens: list[list[int]] = [[] for _ in range(n)]
    sums = np.zeros(n)
    rows = np.repeat(first[None].astype(np.float64), n, axis=0)
    for _ in range(max_new_tokens):
        picked = []
        for k in range(n):
            seq = tokens[k]
            if seq and seq[-1] == eot:
                picked.append(eot)  # finished: the end token again
                continue
            row = rows[k].astype(np.float64)
            filters(row, seq)
            logp = log_softmax(row)
            p = np.exp(log_softmax(row / temperature))
            tok = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
            tok = min(tok, row.size - 1)
            while p[tok] == 0:  # rounding at the cumulative sum's top: the last possible one
                tok -= 1
            sums[k] += logp[tok]
            picked.append(tok)
        for k, tok in enumerate(picked):
            tokens[k].append(tok)
        if all(t == eot for t in picked):
            break
        if len(tokens[0]) < max_new_tokens:
            rows = step(picked)
    return rank([(tuple(t[:t.index(eot)] if eot in t else t), float(s))
                 for t, s in zip(tokens, sums)], length_penalty)
