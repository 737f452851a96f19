"""The speculative generation loop: generate.generate_step's contract, several tokens a
step (see the package docstring)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from ..kernels.token_mask import mask_logits
from .lookup import LookupProposer
from .tuner import Tuner
from .verify import Verifier

ROWS = 8  # rows of a verify step at most (a guess of up to 7 tokens)


class Speculation:
    """A model's speculative decoding: its proposer (made per generation by `proposer()`),
    verify step and tuner, and the counts of guessed and accepted tokens."""

    def __init__(self, model, proposer, rows: int = ROWS):
        self.model, self.make_proposer = model, proposer
        self.verifier = Verifier(model, rows)
        self.tuner = Tuner(rows)
        self.proposed = self.accepted = 0  # this generation's

    @classmethod
    def lookup(cls, model, rows: int = ROWS) -> Speculation | None:
        """Prompt lookup on `model` (None where it has no fused step to verify with)."""
        if not Verifier.usable(model) or model.kv_spare < rows - 1:
            return None
        return cls(model, LookupProposer, rows)

    def start(self):
        """A new generation: its proposer, and counts from zero."""
        self.proposed = self.accepted = 0
        self.tuner.start()
        return self.make_proposer()


def _pick(logits, sampler, history, constraint) -> int:
    """One token as generate_step samples it: the constraint's mask, then the sampler."""
    if constraint is not None:
        constraint.fill()
        mask_logits(logits, constraint.mask)
    token = sampler.sample(logits, history)
    if constraint is not None:
        constraint.advance(token)
    history.append(token)
    return token


def _allowed(constraint, guesses: list[int]) -> list[int]:
    """The guesses up to the first one the grammar forbids after the ones before it."""
    if constraint is None or not guesses:
        return guesses
    constraint.wait()
    return guesses[:constraint.valid_prefix(guesses)]


def speculative_steps(model, prompt: np.ndarray, sampler, history: list[int],
                      shift: bool = True, constraint=None, limit: int | None = None,
                      eos=(), spec: Speculation | None = None) -> Iterator[int]:
    """As generate.generate_step (prefill `prompt`, then yield sampled ids; the last one
    yielded is never run), guessing with `spec`: each row of a verify step is sampled as
    generate_step samples it, so the ids are generate_step's. The rows run past the
    last id yielded are taken back off the cache as soon as the sample leaves the guesses,
    or when the caller stops (a stop string, the limit, an end of sequence)."""
    proposer = spec.start()
    tuner, verifier = spec.tuner, spec.verifier
    if constraint is not None:
        constraint.fill_async()
    logits = model.forward(prompt, want="last", shift=shift)
    token = _pick(logits, sampler, history, constraint)
    produced = 1
    yield token
    while True:
        # rows must fit without a shift, one slot left (stream's room test sees it as plain
        # decoding would), and no more than the caller takes
        most = min(model.cache.room() - 2, (limit - produced - 1) if limit else 1 << 30)
        k = tuner.length(most)
        guesses = _allowed(constraint, proposer.propose(history, k)) if k else []
        if guesses and not verifier.fits(len(guesses) + 1):
            guesses = []
        t0 = time.perf_counter()
        if not guesses:
            if constraint is not None:
                constraint.fill_async()
            logits = model.forward(np.array([token], np.int64), want="last", shift=shift)
            tuner.timed(1, time.perf_counter() - t0)
            token = _pick(logits, sampler, history, constraint)
            produced += 1
            yield token
            continue
        rows = [token, *guesses]
        n = len(rows)
        logits = verifier.run(rows)
        tuner.timed(n, time.perf_counter() - t0)
        spec.proposed += len(guesses)
        for j in range(n):
            token = _pick(logits[j], sampler, history, constraint)
            produced += 1
            taken = j < n - 1 and token == rows[j + 1]
            if taken:
                spec.accepted += 1
                ahead = n - 1 - j  # rows run past this token (plain decoding has not)
            else:
                tuner.observe(len(guesses), j)
                model.take_back(n - 1 - j)
                ahead = 0
            try:
                yield token
            except GeneratorExit:
                if ahead:
                    model.take_back(ahead)
                raise
            if not taken:
                break
