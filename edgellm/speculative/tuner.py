"""How many tokens to guess: the number that maximizes the tokens a step yields per unit
of its cost, from the measured acceptance and the measured cost of a step of n rows; none
(plain decoding, then a probe now and then) where no number beats plain decoding.

With a per-token acceptance a (each guess taken with probability a, until one is not), a
step of k guesses yields E(k) = 1 + a + ... + a^k tokens for the cost c(k + 1) of k + 1
rows against c(1) = 1 for a plain step's one token."""

from __future__ import annotations

PRIOR = 0.25  # a row's cost beyond the first, as a share of a one-row step, until measured
GAIN = 1.05  # guessing must promise this many times plain decoding's tokens per second
DECAY = 0.9  # the weight of earlier steps' acceptance at each new step
EMA = 0.2  # the weight of a new timing
BACKOFF_MAX = 64  # plain steps at most between two probes


def expected_tokens(k: int, a: float) -> float:
    """E(k): tokens a step of k guesses yields at per-token acceptance a."""
    return float(sum(a ** i for i in range(k + 1)))


class Tuner:
    """Guess lengths for a verify step of at most `rows` rows (k <= rows - 1)."""

    def __init__(self, rows: int):
        self.rows = rows
        self.secs: dict[int, float] = {}  # rows -> seconds a step (EMA)
        self.seen: set[int] = set()
        self.start()

    def start(self, measured: bool = True) -> None:
        """A new generation: its acceptance is its own (the costs carry over). measured=
        False: the prior costs, not the timings (a draft model's seeded sampling: its
        guess lengths then follow the acceptance alone, and so does its output)."""
        self.measured = measured
        self.taken, self.missed = 1.0, 1.0  # decayed counts: guesses taken, steps that missed
        self.skip, self.backoff = 0, 2

    @property
    def acceptance(self) -> float:
        return self.taken / (self.taken + self.missed)

    def cost(self, n: int) -> float:
        """A step of n rows against a one-row step (measured where both are)."""
        if self.measured and n in self.secs and 1 in self.secs:
            return max(self.secs[n] / self.secs[1], 1.0)
        return 1.0 + PRIOR * (n - 1)

    def length(self, most: int) -> int:
        """Guesses to make now (at most `most`): 0 means a plain step."""
        most = min(most, self.rows - 1)
        if most <= 0:
            return 0
        if self.skip > 0:
            self.skip -= 1
            return 1 if self.skip == 0 else 0  # the probe after a pause
        a = self.acceptance
        best, k = GAIN, 0
        for n in range(1, most + 1):
            gain = expected_tokens(n, a) / self.cost(n + 1)
            if gain > best:
                best, k = gain, n
        if k == 0:  # off for a while, longer each time it stays off
            self.skip, self.backoff = self.backoff, min(2 * self.backoff, BACKOFF_MAX)
        else:
            self.backoff = 2
        return k

    def observe(self, guessed: int, taken: int) -> None:
        """A verify step's outcome: `taken` of `guessed` guesses accepted."""
        self.taken = self.taken * DECAY + taken
        self.missed = self.missed * DECAY + (taken < guessed)

    def timed(self, n: int, secs: float) -> None:
        """A step of n rows took secs. The first step of each n is not counted (it may have
        compiled or paged in the kernel), nor more than 4x the estimate of a later one (a
        preempted step)."""
        if n not in self.seen:
            self.seen.add(n)
            return
        old = self.secs.get(n)
        self.secs[n] = secs if old is None else old + EMA * (min(secs, 4 * old) - old)
