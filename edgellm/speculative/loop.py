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

    def __init__(self, model, proposer, rows: int = ROWS, verifier=None,
                 guess_prior: float = 0.0):
        self.model, self.make_proposer = model, proposer
        # verifier: Verifier's fits(n) and run(tokens) (a server's slot: served.py's)
        self.verifier = Verifier(model, rows) if verifier is None else verifier
        self.tuner = Tuner(rows, guess_prior)  # guess_prior: a guess's cost (Tuner)
        self.proposed = self.accepted = 0  # this generation's

    draft = None  # the draft model's LLM (draft.py), closed with the target

    @classmethod
    def lookup(cls, model, rows: int = ROWS) -> Speculation | None:
        """Prompt lookup on `model` (None where it has no fused step to verify with)."""
        if not Verifier.usable(model) or model.kv_spare < rows - 1:
            return None
        return cls(model, lambda sampler: LookupProposer(), rows)

    def start(self, sampler, measured: bool = True):
        """A new generation sampled by `sampler`: its proposer, and counts from zero
        (measured: see Tuner.start)."""
        self.proposed = self.accepted = 0
        self.tuner.start(measured)
        return self.make_proposer(sampler)


def _pick(logits, sampler, history, constraint, keyed=None) -> int:
    """One token as generate_step samples it: the constraint's mask, then the sampler
    (keyed: the seed whose rng at this position it draws with, draft.py)."""
    _key(sampler, history, keyed)
    if constraint is not None:
        constraint.fill()
        mask_logits(logits, constraint.mask)
    token = sampler.sample(logits, history)
    if constraint is not None:
        constraint.advance(token)
    history.append(token)
    return token


def _key(sampler, history, keyed) -> None:
    if keyed is not None:
        sampler.rng = np.random.default_rng([keyed, len(history)])


def _accept(logits, sampler, history, constraint, guess: int, q: np.ndarray,
            keyed=None) -> int:
    """Speculative sampling of a guess drawn from the draft's distribution q: the guess
    with probability min(1, p/q) (p: what _pick would draw from), else a draw from the
    residual max(0, p - q) normalized; the result is distributed as p."""
    _key(sampler, history, keyed)
    if constraint is not None:
        constraint.fill()
        mask_logits(logits, constraint.mask)
    p = sampler.distribution(logits, history)
    if sampler.rng.random() * q[guess] < p[guess]:
        token = guess
    else:
        r = np.maximum(p - q, 0.0)
        total = r.sum()
        token = int(sampler.rng.choice(r.size, p=r / total if total > 0 else p))
    sampler.record(token)
    if constraint is not None:
        constraint.advance(token)
    history.append(token)
    return token


def _guesses(proposer, tuner, history: list[int], most: int) -> list[int]:
    """The proposer's guesses after `history`, as many as the tuner asks for (at most
    `most`). A free proposer (lookup) guesses first, so that the tuner sizes them by their
    kind; a draft model is asked for the tuner's number only (each guess costs a step)."""
    if getattr(proposer, "free", False):
        guesses = proposer.propose(history, min(most, tuner.rows - 1))
        return guesses[:tuner.length(most, proposer.kind)] if guesses else []
    k = tuner.length(most)
    if not k:
        return []
    guesses = proposer.propose(history, k)
    tuner.guessed(*proposer.spent)
    return guesses


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
    params = sampler.params
    # a draft model's seeded sampling: every draw keyed by its position, the guess
    # lengths independent of timings (draft.py)
    keyed = params.seed if spec.draft is not None and params.temperature > 0 else None
    proposer = spec.start(sampler, measured=keyed is None)
    tuner, verifier = spec.tuner, spec.verifier
    if constraint is not None:
        constraint.fill_async()
    logits = model.forward(prompt, want="last", shift=shift)
    if hasattr(proposer, "prefill"):  # a draft model reads the prompt now, not mid-decode
        proposer.prefill(history)
    token = _pick(logits, sampler, history, constraint, keyed)
    produced = 1
    yield token
    while True:
        # rows must fit without a shift, one slot left (stream's room test sees it as plain
        # decoding would), and no more than the caller takes
        most = min(model.cache.room() - 2, (limit - produced - 1) if limit else 1 << 30)
        guesses = _guesses(proposer, tuner, history, most)
        guesses = _allowed(constraint, guesses)
        if guesses and not verifier.fits(len(guesses) + 1):
            guesses = []
        t0 = time.perf_counter()
        if not guesses:
            if constraint is not None:
                constraint.fill_async()
            logits = model.forward(np.array([token], np.int64), want="last", shift=shift)
            tuner.timed(1, time.perf_counter() - t0)
            token = _pick(logits, sampler, history, constraint, keyed)
            produced += 1
            yield token
            continue
        kind = getattr(proposer, "kind", 0)
        rows = [token, *guesses]
        qs = getattr(proposer, "qs", None)  # the draft's distributions, or point masses
        n = len(rows)
        logits = verifier.run(rows)
        tuner.timed(n, time.perf_counter() - t0)
        spec.proposed += len(guesses)
        for j in range(n):
            if qs is not None and j < n - 1:
                token = _accept(logits[j], sampler, history, constraint, rows[j + 1], qs[j],
                                keyed)
            else:
                token = _pick(logits[j], sampler, history, constraint, keyed)
            produced += 1
            taken = j < n - 1 and token == rows[j + 1]
            if taken:
                spec.accepted += 1
                ahead = n - 1 - j  # rows run past this token (plain decoding has not)
            else:
                tuner.observe(len(guesses), j, kind)
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
