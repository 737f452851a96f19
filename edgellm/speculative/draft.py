"""A draft model's guesses (draft="small.edgellm"): a smaller model with the same
tokenizer, or the same model at a lower precision (a q8_0 target, its q4_0 file as the
draft), decodes k tokens ahead of the target on its own cache.

Greedy generation guesses the draft's argmax tokens: point masses, verified by the
target's own draw (loop.py), so the output is the target's token for token. With
temperature > 0 the draft draws its tokens from its own distribution q (the request's
sampling settings, its own rng seeded from the request's seed) and the loop accepts each
with min(1, p/q), resampling from the residual max(0, p - q) (speculative sampling: the
output's distribution is the target's own). A seed gives the same output again: every
draw of the generation, the draft's and the target's, comes from an rng keyed by the
seed and its position, the draft runs each token after the prompt through its decode
step alone (its distribution at a position does not depend on how its tokens were
grouped), and the tuner sizes the guesses from the acceptance alone, not from timings
(Tuner.start(measured=False)).

The draft reads the prompt with the target (prefill, before the first token: its cost is
the prompt's, not the decode's). Greedy, it catches up on the tokens it missed while the
tuner had guessing off in one chunk (the prefill's kernels: its guesses may round
differently, the output is the target's whatever they are). `spent` holds the decode
steps the last proposal ran and their seconds (the tuner's measure of a guess's cost)."""

from __future__ import annotations

import time

import numpy as np

from ..errors import ArgumentError
from ..sampling import Sampler


class DraftProposer:
    """Guesses from `draft` (an LLM) for one generation sampled by `sampler` (the
    target's): `qs` holds the draft's distribution of each guess of the last proposal,
    or None (greedy: point masses)."""

    def __init__(self, draft, sampler: Sampler | None):
        self.model = draft.model
        self.model.reset()  # a generation's draft from its prompt (see the docstring)
        greedy = sampler is None or sampler.params.temperature == 0
        self.sampler = None if greedy else Sampler(sampler.params, sampler.vocab_size)
        self.seed = None if greedy else sampler.params.seed
        self.qs: list[np.ndarray] | None = None
        self.spent = (0, 0.0)  # decode steps the last proposal ran, and their seconds

    def prefill(self, prompt: list[int]) -> None:
        """Run the prompt through the draft (with the target's prefill)."""
        if not self.model.tokens and prompt:
            self.model.forward(np.array(prompt, np.int64), want="none")

    def _step(self, token: int) -> np.ndarray:
        """One of the draft's decode steps, counted in `spent`."""
        t0 = time.perf_counter()
        logits = self.model.forward(np.array([token], np.int64), want="last")
        steps, secs = self.spent
        self.spent = (steps + 1, secs + time.perf_counter() - t0)
        return logits

    def _sync(self, history: list[int]) -> np.ndarray:
        """The draft's logits after `history`: its cache cut back to the longest prefix it
        shares with `history` (its last guesses, or an earlier generation), the rest run."""
        m = self.model
        common = 0
        for a, b in zip(m.tokens, history):
            if a != b:
                break
            common += 1
        common = min(common, len(history) - 1)  # at least one token to run: its logits
        if not m.tokens:  # the prompt: prefilled
            return m.forward(np.array(history, np.int64), want="last")
        m.truncate(common)
        rest = history[len(m.tokens):]
        if self.sampler is None and len(rest) > 2:  # greedy catching up: one chunk
            m.forward(np.array(rest[:-1], np.int64), want="none")
            rest = rest[-1:]
        for t in rest:
            logits = self._step(t)
        return logits

    def propose(self, history: list[int], k: int) -> list[int]:
        self.spent = (0, 0.0)
        if k <= 0:
            self.qs = None
            return []
        logits = self._sync(history)
        guesses, qs = [], []
        seen = list(history)
        for i in range(k):
            if self.sampler is None:
                token = int(np.argmax(logits))
            else:
                q = self.sampler.distribution(logits, seen)
                if self.seed is not None:
                    self.sampler.rng = np.random.default_rng([self.seed, 1, len(seen)])
                token = int(self.sampler.rng.choice(q.size, p=q))
                qs.append(q)
            guesses.append(token)
            seen.append(token)
            if i < k - 1:
                logits = self._step(token)
        self.qs = qs if self.sampler is not None else None
        return guesses


def draft_speculation(llm, path: str):
    """The Speculation of `llm` guessing with the draft model file `path` (None where the
    target has no fused step to verify with); ArgumentError where the draft's vocabulary
    or tokenizer is not the target's."""
    from ..llm import LLM
    from .loop import Speculation
    from .verify import Verifier

    draft = LLM(path, threads=llm.threads, context=llm.model.context)
    try:
        if draft.args.vocab_size != llm.args.vocab_size or \
                draft.tokenizer.to_json() != llm.tokenizer.to_json():
            raise ArgumentError(f"draft {path}: its tokenizer is not the model's (a draft "
                                "model must share the target's vocabulary)")
    except BaseException:
        draft.close()
        raise
    if not Verifier.usable(llm.model):
        draft.close()
        return None
    spec = Speculation(llm.model, lambda sampler: DraftProposer(draft, sampler),
                       guess_prior=_bytes(draft.model) / _bytes(llm.model))
    spec.draft = draft
    return spec


def _bytes(model) -> int:
    """Weight bytes a decode step of `model` reads (the prior of a step's cost)."""
    return sum(w.nbytes for w in model.streamed())
