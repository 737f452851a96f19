"""Sampling: logits [vocab] -> next token id.

One `Sampler` per generation. Each call runs, in this order (llama.cpp's chain order for the
processors, transformers' order for the filters):

1. logit_bias       logits[id] += bias (-inf bans the id)
2. repetition       over the distinct ids in the last `repetition_context` ids of `history`
                    (prompt + generated; None = all of it): logit > 0 -> logit / r,
                    logit <= 0 -> logit * r  (transformers / llama.cpp)
3. presence,        OpenAI: logits[id] -= frequency * count[id] + presence * (count[id] > 0),
   frequency        count = how often this sampler returned id since reset()
4. temperature      0 -> greedy argmax (filters and rng unused)
5. top-k            keep the k largest (0 = off)
6. top-p            keep the smallest set of most likely tokens with mass >= top_p
                    (mass renormalized over what top-k kept, as in transformers)
7. min-p            keep tokens with p >= min_p * p_max
then draw from the kept tokens in proportion to their probabilities.

A constraint's token mask is applied before (generate.py): forbidden ids come in as -inf and
every step keeps them there; if no id is left, sample raises ConstraintError.

Cost: no sort of the vocabulary, O(V) numpy passes at most. Top-k takes a threshold from
a strided sample of the logits, then `argpartition` over the few ids above it. Top-p (and
min-p keeping many ids) draws from the whole softmax by block sums, then accepts the draw
if it is in the kept set (for top-p: the mass of more likely tokens is < top_p, one dot
product): rejection gives an exact draw, accepted with probability >= top_p. Small
min-p sets are a threshold on the logits. Processors touch only the ids they change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgellm.errors import ConstraintError, NonFiniteLogitsError, SamplingError

_SAMPLE_SIZE = 4096  # strided sample for top-k thresholds; size of a "small" kept set
_TOP_P_START = 256  # top-p fallback: first candidate-set size, grows x8
_BLOCK = 1024  # block size for drawing from the whole vocabulary
_MAX_DRAWS = 8  # rejection draws before the fallback (top_p >= 0.5: fails < 0.4%)


_F32_MAX = float(np.finfo(np.float32).max)
# bounds that keep the processed float32 logits finite (beyond them a value only overflows,
# and the overflow would be blamed on the model's weights): far past any useful setting
_BIAS_MAX = 1e30  # |logit_bias|
_PENALTY_MIN = 1e-6  # repetition_penalty within [1e-6, 1e6]
_ADDITIVE_MAX = 1e6  # |presence_penalty|, |frequency_penalty| (times counts <= the context)


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise SamplingError(f"{name} must be a finite number, got {value!r}")
    return float(value)


_NUMBERS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
            "repetition_context", "presence_penalty", "frequency_penalty", "seed")


@dataclass(frozen=True)
class SamplingParams:
    """What to sample with; validated on construction (ids against vocab in `Sampler`)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context: int | None = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in _NUMBERS:  # numpy scalars (np.float32(0.5), np.int64(3)) as Python's
            value = getattr(self, name)
            if isinstance(value, (np.integer, np.floating)):
                object.__setattr__(self, name, value.item())
        if _finite("temperature", self.temperature) < 0:
            raise SamplingError(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0 < _finite("top_p", self.top_p) <= 1:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= _finite("min_p", self.min_p) <= 1:
            raise SamplingError(f"min_p must be in [0, 1], got {self.min_p}")
        if not _PENALTY_MIN <= _finite("repetition_penalty", self.repetition_penalty) \
                <= 1 / _PENALTY_MIN:
            raise SamplingError(f"repetition_penalty must be in [{_PENALTY_MIN:g}, "
                                f"{1 / _PENALTY_MIN:g}], got {self.repetition_penalty}")
        ctx = self.repetition_context
        if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1):
            raise SamplingError(f"repetition_context must be an int >= 1 or None, got {ctx!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if abs(_finite(name, getattr(self, name))) > _ADDITIVE_MAX:
                raise SamplingError(f"{name} must be within +-{_ADDITIVE_MAX:g}, got "
                                    f"{getattr(self, name)}")
        if not isinstance(self.logit_bias, Mapping):
            raise SamplingError("logit_bias must be a mapping {token_id: bias}")
        for key, value in self.logit_bias.items():
            if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
                raise SamplingError(f"logit_bias keys must be token ids, got {key!r}")
            if value != -math.inf and abs(_finite(f"logit_bias[{key}]", value)) > _BIAS_MAX:
                # -inf bans the id (OpenAI's -100 only discourages it)
                raise SamplingError(f"logit_bias[{key}] must be within +-{_BIAS_MAX:g} (or "
                                    f"-inf, a ban), got {value}")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int) or self.seed < 0):
            raise SamplingError(f"seed must be an int >= 0 or None, got {self.seed!r}")

    @classmethod
    def from_generation_config(cls, config: Mapping, **overrides: object) -> SamplingParams:
        """Defaults from a Hugging Face generation_config.json (transformers' own defaults
        where it is silent: do_sample false -> greedy, top_k 50 when sampling)."""
        def get(key: str, default: float) -> float:
            value = config.get(key)
            return default if value is None else value

        if not config.get("do_sample", False):
            params: dict = {"temperature": 0.0}
        else:
            params = {"temperature": get("temperature", 1.0), "top_k": get("top_k", 50),
                      "top_p": get("top_p", 1.0), "min_p": get("min_p", 0.0)}
        params["repetition_penalty"] = get("repetition_penalty", 1.0)
        params.update(overrides)
        return cls(**params)


def _top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest of x [V] (unordered), without partitioning all of x."""
    n = x.size
    if k >= n:
        return np.arange(n)
    if n > 4 * _SAMPLE_SIZE:
        # Threshold at a high quantile of a strided sample; expect k * 1.x ids above it.
        sample = x[:: n // _SAMPLE_SIZE]
        expect = k * sample.size / n
        j = min(sample.size, math.ceil(expect + 4 * math.sqrt(expect) + 8))
        threshold = np.partition(sample, sample.size - j)[sample.size - j]
        cand = np.flatnonzero(x >= threshold)
        if cand.size >= k:  # else the sample misled us: fall back on the exact way
            if cand.size == k:
                return cand
            return cand[np.argpartition(x[cand], cand.size - k)[cand.size - k:]]
    return np.argpartition(x, n - k)[n - k:]


def _check_max(m: float) -> None:
    """The largest processed logit must be finite; -inf means every id is forbidden."""
    if m == -math.inf:
        raise ConstraintError("every token is forbidden: the constraint and logit_bias "
                              "(-inf) leave none to sample")
    if not math.isfinite(m):
        raise NonFiniteLogitsError("logits contain NaN or +inf")


class Sampler:
    """Samples token ids for one generation with fixed `SamplingParams`.

    `sample` records each id it returns for the presence/frequency penalties; call
    `reset()` before a new generation.
    """

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        if vocab_size < 1:
            raise SamplingError(f"vocab_size must be >= 1, got {vocab_size}")
        for key in params.logit_bias:
            if not 0 <= key < vocab_size:
                raise SamplingError(f"logit_bias id {key} outside the vocabulary [0, {vocab_size})")
        self.params = params
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(params.seed)
        self._bias_ids = np.fromiter(params.logit_bias.keys(), np.int64, len(params.logit_bias))
        self._bias = np.fromiter(params.logit_bias.values(), np.float32, len(params.logit_bias))
        self._penalize = params.presence_penalty != 0 or params.frequency_penalty != 0
        self._counts = np.zeros(vocab_size if self._penalize else 0, np.float32)
        self._seen = np.empty(0, np.int64)  # distinct generated ids, first _n_seen valid
        self._n_seen = 0
        self._x = np.empty(vocab_size, np.float32)  # processed logits
        # exp buffer for full-vocabulary draws, padded to whole blocks
        self._e = np.zeros(-(-vocab_size // _BLOCK) * _BLOCK, np.float32)

    def reset(self) -> None:
        """Forget generated ids (presence/frequency counts); the rng continues."""
        if self._n_seen:
            self._counts[self._seen[: self._n_seen]] = 0
        self._n_seen = 0

    def process(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """Steps 1-3: logits [V] -> processed logits [V]. Returns `logits` itself if no
        processor is on, else an internal buffer valid until the next call."""
        logits = np.asarray(logits)
        if logits.shape != (self.vocab_size,):
            raise SamplingError(f"logits must have shape ({self.vocab_size},), "
                                f"got {logits.shape}")
        p = self.params
        repeat = p.repetition_penalty != 1 and len(history) > 0
        if not (self._bias.size or repeat or (self._penalize and self._n_seen)):
            return logits
        x = self._x
        np.copyto(x, logits)
        if self._bias.size:
            x[self._bias_ids] += self._bias
        if repeat:
            recent = history if p.repetition_context is None else history[-p.repetition_context:]
            ids = np.unique(np.asarray(recent, dtype=np.int64))
            ids = ids[(ids >= 0) & (ids < self.vocab_size)]
            v = x[ids]
            x[ids] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if self._penalize and self._n_seen:
            ids = self._seen[: self._n_seen]
            c = self._counts[ids]
            x[ids] -= p.frequency_penalty * c + p.presence_penalty
        return x

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """logits [V] (float), history = ids so far (prompt + generated) -> next id."""
        token = self._choose(self.process(logits, history))
        self.record(token)
        return token

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The probabilities [V] (float64) `sample` draws the next id from: steps 1-7
        (greedy: all on the argmax). Speculative sampling compares two of them."""
        x = self.process(logits, history).astype(np.float64)
        p = self.params
        out = np.zeros(x.size)
        m = float(x.max())
        _check_max(m)
        if p.temperature == 0 or 1.0 / p.temperature > _F32_MAX:
            out[int(np.argmax(x))] = 1.0
            return out
        ids = _top_k_ids(x, p.top_k) if 0 < p.top_k < x.size else np.flatnonzero(x > -np.inf)
        xs = x[ids]
        e = np.exp((xs - m) / p.temperature)
        if p.top_p < 1:  # the smallest most likely set with mass >= top_p (as _draw_among)
            order = np.argsort(-xs, kind="stable")
            ids, xs, e = ids[order], xs[order], e[order]
            keep = int(np.searchsorted(np.cumsum(e), p.top_p * e.sum())) + 1
            ids, xs, e = ids[:keep], xs[:keep], e[:keep]
        if p.min_p > 0:
            sel = xs >= self._min_p_cutoff(m)
            ids, e = ids[sel], e[sel]
        out[ids] = e / e.sum()
        return out

    def record(self, token: int) -> None:
        """Count `token` as returned (the presence/frequency penalties), as sample does."""
        if self._penalize:
            if self._counts[token] == 0:
                if self._n_seen == self._seen.size:
                    self._seen = np.resize(self._seen, max(64, 2 * self._seen.size))
                self._seen[self._n_seen] = token
                self._n_seen += 1
            self._counts[token] += 1

    def _choose(self, x: np.ndarray) -> int:
        p = self.params
        if p.temperature == 0 or 1.0 / p.temperature > _F32_MAX:  # 1/T would overflow: greedy
            token = int(np.argmax(x))
            _check_max(float(x[token]))
            return token
        m = float(x.max())
        _check_max(m)
        n = x.size
        if 0 < p.top_k < n:
            return self._draw_among(x, _top_k_ids(x, p.top_k), m)
        cutoff = self._min_p_cutoff(m) if p.min_p > 0 else -math.inf  # min-p keeps x >= cutoff
        if p.top_p == 1 and cutoff > -math.inf:
            ids = np.flatnonzero(x >= cutoff)
            if ids.size <= _SAMPLE_SIZE:
                return self._draw(ids, x[ids], m)
        e = self._e  # exp((x - m) / T), zero-padded to whole blocks
        np.subtract(x, m, out=e[:n])
        if p.temperature != 1:
            np.multiply(e, 1.0 / p.temperature, out=e)
        np.exp(e, out=e)
        e[n:] = 0.0
        sums = e.reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64)
        if p.top_p < 1:
            # Draw from the whole distribution and keep the draw if it is in the nucleus
            # (the mass of more likely tokens is < top_p): an exact draw from the nucleus,
            # accepted with probability >= top_p.
            z = float(sums.sum())

            def keep(i: int) -> bool:
                return x[i] >= cutoff and (x[i] >= m or np.dot(e[:n], x > x[i]) < p.top_p * z)

            token = self._draw_full(e, sums, keep)
            if token is not None:
                return token
            k = _TOP_P_START  # unlucky, or top_p small: find the nucleus among the top k
            while True:
                ids = _top_k_ids(x, k)
                if k >= n or e[ids].sum(dtype=np.float64) >= p.top_p * z:
                    return self._draw_among(x, ids, m, z)
                k *= 8
        token = self._draw_full(e, sums, lambda i: x[i] >= cutoff)
        if token is None:  # min-p keeps little of the mass: mask and draw again
            e[:n] *= x >= cutoff
            sums = e.reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64)
            token = self._draw_full(e, sums, lambda i: True)
        return token

    def _min_p_cutoff(self, m: float) -> float:
        """p_i >= min_p * p_max  <=>  x_i >= max + T * log(min_p)."""
        return m + self.params.temperature * math.log(self.params.min_p)

    def _draw_among(self, x: np.ndarray, ids: np.ndarray, m: float, z: float | None = None) -> int:
        """Apply top-p and min-p to candidate ids that hold every token they can keep,
        then draw. z = top-p normalizer (None: the candidates' own mass)."""
        p = self.params
        xs = x[ids]
        if p.top_p < 1:
            order = np.argsort(-xs, kind="stable")  # most likely first
            ids, xs = ids[order], xs[order]
            cum = np.cumsum(np.exp((xs.astype(np.float64) - m) / p.temperature))
            keep = int(np.searchsorted(cum, p.top_p * (cum[-1] if z is None else z))) + 1
            ids, xs = ids[:keep], xs[:keep]
        if p.min_p > 0:
            sel = xs >= self._min_p_cutoff(m)
            ids, xs = ids[sel], xs[sel]
        return self._draw(ids, xs, m)

    def _draw(self, ids: np.ndarray, xs: np.ndarray, m: float) -> int:
        """Draw one of ids [k] with probability proportional to exp((xs - m) / T)."""
        cum = np.cumsum(np.exp((xs.astype(np.float64) - m) / self.params.temperature))
        i = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
        return int(ids[min(i, ids.size - 1)])

    def _draw_full(self, e: np.ndarray, sums: np.ndarray, keep) -> int | None:
        """Draw i with probability e[i] / sum(e) until keep(i), at most _MAX_DRAWS times.

        e [blocks * _BLOCK] (zero past the vocabulary), sums [blocks] its block sums: pick a
        block by its sum, then an id in it by a cumsum over the block. Rejecting the draws
        outside the kept set leaves an exact draw from within it. None if all rejected.
        """
        cum = np.cumsum(sums)
        for _ in range(_MAX_DRAWS):
            u = self.rng.random() * cum[-1]
            b = min(int(np.searchsorted(cum, u, side="right")), cum.size - 1)
            inner = np.cumsum(e[b * _BLOCK: (b + 1) * _BLOCK], dtype=np.float64)
            u -= cum[b - 1] if b else 0.0
            i = b * _BLOCK + min(int(np.searchsorted(inner, u, side="right")), _BLOCK - 1)
            if e[i] > 0 and keep(i):
                return i
        return None
