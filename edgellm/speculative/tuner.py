"""How many tokens to guess: the number that maximizes the tokens a step yields per unit
of its cost, from the measured acceptance and the measured cost of a step of n rows; none
(plain decoding, then a probe now and then) where no number beats plain decoding.

With a per-token acceptance a (each guess taken with probability a, until one is not), a
step of k guesses yields E(k) = 1 + a + ... + a^k tokens for the cost c(k + 1) of k + 1
rows, plus (k + a^k) * g for making the guesses, against c(1) = 1 for a plain step's one
token. g is 0 for lookup; for a draft model it is the draft's decode step against the
target's: the draft runs k steps a step, one more where every guess was taken (it reads
every token the target keeps, its own guesses and the target's next token). So a draft
pays at most 1 / (g + c(k + 1) / E(k)): at SmolLM2-135M a q4_0 draft's step costs about
half a q8_0 target's and a verify row beyond the second about 0.3 of a step, which puts
that bound near 1.0x even at 93% acceptance.

Costly guesses are not paused and probed as free ones are: a draft left behind while
guessing is off must read every token it missed before its next guess (a prefill chunk
costs it about a quarter of its decode step a token), a tax on every plain step. So a
generation guesses from its start until EVIDENCE verify steps have measured its
acceptance, then keeps guessing while that pays, and once it does not, stops for the
rest of the generation.

Guesses come in kinds, each with its own acceptance and its own pauses: lookup's kind is
the length of the n-gram it matched (a 4-gram's copy is taken far more often than a
2-gram's, which in chat is mostly noise), a draft model's is 0. So a proposer whose long
matches pay keeps guessing them while its short ones stay off."""

from __future__ import annotations

PRIOR = 0.25  # a row's cost beyond the first, as a share of a one-row step, until measured
GAIN = 1.05  # guessing must promise this many times plain decoding's tokens per second
DECAY = 0.9  # the weight of earlier steps' acceptance at each new step
EMA = 0.2  # the weight of a new timing
BACKOFF_MAX = 64  # plain steps at most between two probes
EVIDENCE = 4  # verify steps of costly guesses before their acceptance may stop them
RETIME = 16  # costly guesses: a plain step to time after this many verify steps


def expected_tokens(k: int, a: float) -> float:
    """E(k): tokens a step of k guesses yields at per-token acceptance a."""
    return float(sum(a ** i for i in range(k + 1)))


class Acceptance:
    """Decayed counts of guesses taken and steps that missed: the per-token acceptance."""

    def __init__(self):
        self.taken, self.missed = 1.0, 1.0  # a prior of 1/2

    @property
    def rate(self) -> float:
        return self.taken / (self.taken + self.missed)

    def observe(self, guessed: int, taken: int) -> None:
        """A verify step's outcome: `taken` of `guessed` guesses accepted."""
        self.taken = self.taken * DECAY + taken
        self.missed = self.missed * DECAY + (taken < guessed)


class _Kind(Acceptance):
    """One kind of guesses' acceptance and pauses."""

    def __init__(self):
        super().__init__()
        self.skip, self.backoff = 0, 2
        self.steps = 0  # verify steps observed
        self.stopped = False  # costly guesses that did not pay: none for the generation

    def observe(self, guessed: int, taken: int) -> None:
        super().observe(guessed, taken)
        self.steps += 1


class Tuner:
    """Guess lengths for a verify step of at most `rows` rows (k <= rows - 1)."""

    def __init__(self, rows: int, guess_prior: float = 0.0):
        self.rows = rows
        self.secs: dict[int, float] = {}  # rows -> seconds a step (EMA)
        self.seen: set[int] = set()
        # a guess's cost as a share of a one-row step until measured (and for seeded
        # sampling): 0 for lookup, a draft's streamed bytes over the target's
        self.guess_prior = guess_prior
        self.guess_secs: float | None = None  # seconds of one of the draft's steps (EMA)
        self.guess_seen = False
        self.since_plain = 0  # verify steps since the last timed plain step
        self.start()

    def start(self, measured: bool = True) -> None:
        """A new generation: its acceptance is its own (the costs carry over). measured=
        False: the prior costs, not the timings (a draft model's seeded sampling: its
        guess lengths then follow the acceptance alone, and so does its output)."""
        self.measured = measured
        self.kinds: dict[int, _Kind] = {}

    def _kind(self, kind: int) -> _Kind:
        if kind not in self.kinds:
            self.kinds[kind] = _Kind()
        return self.kinds[kind]

    def acceptance(self, kind: int = 0) -> float:
        """The per-token acceptance of guesses of `kind` so far (a prior of 1/2)."""
        return self._kind(kind).rate

    def cost(self, n: int) -> float:
        """A step of n rows against a one-row step (measured where both are)."""
        if self.measured and n in self.secs and 1 in self.secs:
            return max(self.secs[n] / self.secs[1], 1.0)
        return 1.0 + PRIOR * (n - 1)

    def guess_cost(self) -> float:
        """A guess's cost as a share of a one-row step: the draft's measured step against
        the target's (where both are measured), else the prior."""
        if self.measured and self.guess_secs is not None and 1 in self.secs:
            return self.guess_secs / self.secs[1]
        return self.guess_prior

    def length(self, most: int, kind: int = 0) -> int:
        """Guesses of `kind` to make now (at most `most`): 0 means a plain step."""
        most = min(most, self.rows - 1)
        if most <= 0:
            return 0
        if self.guess_prior and self.measured and (1 not in self.secs or
                                                   self.since_plain >= RETIME):
            return 0  # a plain step to time: costly guesses are weighed against it
        st = self._kind(kind)
        if st.stopped:
            return 0
        if st.skip > 0:
            st.skip -= 1
            return 1 if st.skip == 0 else 0  # the probe after a pause
        a = self.acceptance(kind)
        g = self.guess_cost()
        best, k = GAIN, 0
        for n in range(1, most + 1):
            gain = expected_tokens(n, a) / (self.cost(n + 1) + (n + a ** n) * g)
            if gain > best:
                best, k = gain, n
        if self.guess_prior:  # costly guesses: no pauses (see the docstring)
            if k == 0 and st.steps >= EVIDENCE:
                st.stopped = True
            return k if st.steps >= EVIDENCE else max(k, 1)
        if k == 0:  # off for a while, longer each time it stays off
            st.skip, st.backoff = st.backoff, min(2 * st.backoff, BACKOFF_MAX)
        else:
            st.backoff = 2
        return k

    def observe(self, guessed: int, taken: int, kind: int = 0) -> None:
        """A verify step's outcome: `taken` of `guessed` guesses of `kind` accepted."""
        self._kind(kind).observe(guessed, taken)

    def timed(self, n: int, secs: float) -> None:
        """A step of n rows took secs. The first step of each n is not counted (it may have
        compiled or paged in the kernel); later ones move the estimate as _follow says."""
        self.since_plain = 0 if n == 1 else self.since_plain + 1
        if n not in self.seen:
            self.seen.add(n)
            return
        old = self.secs.get(n)
        self.secs[n] = _follow(old, secs)

    def guessed(self, steps: int, secs: float) -> None:
        """The proposer ran `steps` decode steps of its own in secs (the first call not
        counted: it may have compiled or paged in the draft)."""
        if steps <= 0:
            return
        if not self.guess_seen:
            self.guess_seen = True
            return
        per, old = secs / steps, self.guess_secs
        self.guess_secs = _follow(old, per)


def _follow(old: float | None, secs: float) -> float:
    """A step-time estimate after a new timing: down fast, up slowly (a quarter of EMA)
    and by at most 4x the estimate. Other processes' preemption only ever adds time, to
    whichever step it hits: the costs compared are the steps' own, the faster timings."""
    if old is None:
        return secs
    return old + (EMA if secs < old else EMA / 4) * (min(secs, 4 * old) - old)
