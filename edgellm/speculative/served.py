"""Prompt lookup on a server's slots (batch.py): each slot guesses from its own prompt and
output, and its verify rows run in the engine's batched step beside the other slots' rows
(a slot's k + 1 rows, the others' one each; step/batched.py runs a slot named j times at
its next j positions, each row the step's logits there bit for bit, whatever else the
step carries). The slot's generation runs loop.speculative_steps unchanged in its
request thread: the same sampling of every verified row (constraint mask, logit_bias,
penalties, stop strings by the caller), the same take_back of the rows past the last
accepted token, so a slot's tokens are those it decodes without guessing.

    slot.speculation = slot_lookup(slot_model, rows)   # Batch does this for draft="lookup"
"""

from __future__ import annotations

import numpy as np

from .lookup import LookupProposer
from .loop import ROWS, Speculation
from .tuner import Acceptance, expected_tokens
from .verify import Verifier


class SlotVerifier(Verifier):
    """Verifier on a slot (batch.SlotModel, whose cache fits() checks): the rows go to the
    engine as one job (want="rows"), run in the round's batched step."""

    def run(self, tokens: list[int]) -> np.ndarray:
        """Logits [n, vocab] (rows of the step's new array) of tokens at the slot's next
        n positions; its cache and tokens advance by n (fits(n) must hold)."""
        return self.model.forward(np.array(tokens, np.int64), want="rows", shift=False)


def slot_rows(slots: int, most: int, spare: int) -> int:
    """Rows one slot's verify step may carry: ROWS, fewer where the step's `most` rows
    (the model's chunk) do not hold every slot's at once or the cache's `spare` slots beside
    a sliding window do not allow them (1: no guessing)."""
    return max(1, min(ROWS, most // slots, spare + 1))


def slot_lookup(view, rows: int) -> Speculation | None:
    """Prompt lookup for the slot `view` (a batch.SlotModel) with verify steps of at most
    `rows` rows (None for fewer than 2)."""
    if rows < 2:
        return None
    return Speculation(view, lambda sampler: LookupProposer(), rows,
                       verifier=SlotVerifier(view, rows))


GAIN = 1.01  # a guess row must shorten the predicted time to the last slot's end this much
PRIOR = 0.25  # a row's cost beyond the first, as a share of a one-row step, until measured
EMA = 0.2


class StepCosts:
    """Seconds of the engine's batched step by its rows (all slots'): a count's own moving
    average once it has TRUST steps (the first of each left out: compiling or paging in;
    the next ones may be the thread chooser's probes, step/schedule.py), else scaled by
    the prior slope from the count with the most steps."""

    TRUST = 4

    def __init__(self):
        self.secs: dict[int, float] = {}
        self.count: dict[int, int] = {}

    def timed(self, rows: int, secs: float) -> None:
        n = self.count[rows] = self.count.get(rows, 0) + 1
        if n == 1:
            return
        old = self.secs.get(rows)
        self.secs[rows] = secs if old is None else old + EMA * (min(secs, 4 * old) - old)

    def __call__(self, rows: int) -> float:
        if self.count.get(rows, 0) > self.TRUST:
            return self.secs[rows]
        if not self.secs:
            return 1.0 + PRIOR * (rows - 1)
        m = max(self.secs, key=lambda r: self.count[r])
        return self.secs[m] * (1.0 + PRIOR * (rows - 1)) / (1.0 + PRIOR * (m - 1))


def makespan(accept: list[float], k: list[int], left: list[int], others: int, cost) -> float:
    """Predicted seconds until the last slot ends, were each guessing slot to guess k[i]
    tokens a step (expect 1 + a + ... + a^k tokens a step) for its `left` tokens, beside
    `others` one-token rows that last as long as the longest: the step's rows, and so its
    cost, fall as slots end."""
    ends = sorted((n / expected_tokens(ki, a), ki + 1)
                  for a, ki, n in zip(accept, k, left))
    rows = sum(r for _, r in ends) + others
    t = done = 0.0
    for steps, r in ends:
        t += (steps - done) * cost(rows)
        done, rows = steps, rows - r
    if others:
        t += (max(left) - done) * cost(others)
    return t


def allocate(accept: list[float], most: list[int], left: list[int], others: int,
             cost) -> list[int]:
    """Guesses for each of the step's guessing slots (accept: each one's per-token
    acceptance; most: the guesses each can make now; left: the tokens each may still
    make) beside `others` rows of slots that do not guess, under the step's measured
    `cost(rows)`. A step's rows slow every slot in it, so a row goes to a slot only where
    it shortens the predicted time to the last slot's end (makespan): the slowest request
    decides a batch's aggregate, and one that guesses nothing pays for the others' rows
    until they end (4 slots of 5 guesses each cost more than they save)."""
    k = [0] * len(accept)
    best = makespan(accept, k, left, others, cost)
    while True:
        # a row more for the m slots whose next guess is likeliest taken, for each m: one
        # slot's row alone rarely shortens the makespan, the slots' rows together may
        open_ = sorted((i for i in range(len(k)) if k[i] < most[i]),
                       key=lambda i: -accept[i] ** (k[i] + 1))
        trials = []
        for m in range(1, len(open_) + 1):
            trial = list(k)
            for i in open_[:m]:
                trial[i] += 1
            trials.append((makespan(accept, trial, left, others, cost), m, trial))
        if not trials:
            return k
        t, _, trial = min(trials)
        if t * GAIN > best:
            return k
        k, best = trial, t


class SpecChain:
    """A slot's unconstrained generation sampled and guessed for by the engine (batch.py's
    _Chain for a slot that guesses): after a verify step the engine samples its rows
    itself with the request's sampler (as plain decoding samples, one draw a token),
    keeps the guesses up to the first the sample leaves, takes the rows past it off the
    slot's cache, and queues the next rows at once (allocate: how many guesses), so the
    request thread is not a round trip between two steps."""

    def __init__(self, sampler, history: list[int], limit, eos, shift: bool,
                 spec: Speculation):
        self.sampler, self.history, self.limit, self.eos = sampler, history, limit, eos
        self.shift = shift
        self.spec = spec
        self.proposer = LookupProposer()
        spec.proposed = spec.accepted = 0
        self.accept = Acceptance()
        self.sampled = 0  # tokens drawn
        self.steps = self.handed = 0  # verify steps sampled, and their tokens handed over
        self.stop = False  # the request thread has stopped: queue no more rows
        self.guesses: list[int] = []  # proposed for the next step (allocate trims them)
        # a proposal scored against the tokens that come, verified or not (the acceptance
        # of guesses the allocation left out too: it learns where it does not guess)
        self.shadow: tuple[int, list[int]] | None = None  # (where it starts, guesses)

    @property
    def acceptance(self) -> float:
        return self.accept.rate

    def sample(self, logits) -> int:
        token = self.sampler.sample(logits, self.history)
        self.history.append(token)
        self.sampled += 1
        return token

    def ends(self, token: int) -> bool:
        """Whether the caller stops at `token` (an end of sequence, the limit)."""
        return token in self.eos or (self.limit is not None and self.sampled >= self.limit)

    def verified(self, view, logits: np.ndarray, rows: np.ndarray) -> tuple[list[int], bool]:
        """Sample the rows' logits [n, vocab] (rows: the tokens run, the last sampled and
        the guesses) up to the first sample that leaves the guesses or ends the
        generation; the rows run past it come off `view`'s cache. (tokens, ended)."""
        n = len(rows)
        out = []
        for j in range(n):
            token = self.sample(logits[j])
            out.append(token)
            ended = self.ends(token)
            if j < n - 1 and token == rows[j + 1] and not ended:
                continue
            view.take_back(n - 1 - j)
            if n > 1:
                self.spec.proposed += n - 1
                self.spec.accepted += j
            self._score()
            self.steps += 1
            return out, ended

    def _score(self) -> None:
        """The acceptance from the pending proposal, once the tokens after it decide it."""
        if self.shadow is None:
            return
        at, guesses = self.shadow
        came = self.history[at:at + len(guesses)]
        j = 0
        while j < len(came) and came[j] == guesses[j]:
            j += 1
        if j < len(came) or j == len(guesses):
            self.accept.observe(len(guesses), j)
            self.shadow = None

    def most(self, view) -> int:
        """Guesses the next step may carry: rows that fit without a shift, one slot left
        (as the API's loop), and no more than the caller takes."""
        left = (self.limit - self.sampled - 1) if self.limit is not None else 1 << 30
        most = min(view.cache.room() - 2, left, self.spec.verifier.rows - 1)
        while most > 0 and not self.spec.verifier.fits(most + 1):
            most -= 1
        return max(most, 0)

    def left(self) -> int:
        """Tokens the generation may still make (its limit; no limit: taken as 256)."""
        return max(1, (self.limit if self.limit is not None else 256 + self.sampled)
                   - self.sampled)

    def propose(self, view) -> int:
        """The guesses the next step may carry (self.guesses): how many."""
        most = self.most(view)
        self.guesses = self.proposer.propose(self.history, most) if most > 0 else []
        if self.guesses and self.shadow is None:
            self.shadow = (len(self.history), list(self.guesses))
        return len(self.guesses)

    def rows(self, k: int) -> np.ndarray:
        """The next step's rows: the last token sampled and k of the guesses."""
        return np.array([self.history[-1], *self.guesses[:k]], np.int64)
