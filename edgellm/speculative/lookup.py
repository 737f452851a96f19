"""Prompt lookup: the next tokens guessed from the last occurrence of the sequence's latest
n-gram in what came before it (the prompt and the output so far), read on through the
guesses where the copy reaches the end (a repeating pattern continues). Strong where the
answer copies its input (extraction, quoting, code edits) or repeats itself; it costs no
model."""

from __future__ import annotations

NGRAMS = (4, 3, 2)  # n-gram sizes tried, the longest first (a 1-gram matches anything)


class LookupProposer:
    """Guesses from `history` (the token ids so far, a list that grows at its end; one
    proposer per generation): an index of each n-gram's last continuation, kept as the
    history grows."""

    def __init__(self, ngrams: tuple[int, ...] = NGRAMS):
        self.ngrams = ngrams
        self.index: dict[tuple, int] = {}  # (n-gram) -> where its last continuation starts
        self.done = 0  # history[:done] indexed
        self.history: list[int] | None = None

    def _index(self, history: list[int]) -> None:
        """Index every n-gram that has a continuation (ending before the last token): the
        latest n-gram is looked up, not found as itself."""
        if history is not self.history or len(history) < self.done:
            self.history, self.index, self.done = history, {}, 0
        for i in range(self.done, len(history)):  # continuation start i: n-gram before it
            for n in self.ngrams:
                if i >= n:
                    self.index[(n, *history[i - n:i])] = i
        self.done = len(history)

    free = True  # guessing costs nothing: the loop asks for the most, then sizes them
    kind = 0  # the n-gram length the last guesses matched (Tuner's kind)

    def propose(self, history: list[int], k: int) -> list[int]:
        """Up to k guessed ids to follow `history` ([] where no n-gram recurs)."""
        self._index(history)
        last = len(history)
        for n in self.ngrams:
            if k > 0 and last > n:
                at = self.index.get((n, *history[last - n:]))
                if at is not None:
                    self.kind = n
                    return _continue(history, at, k)
        return []


def _continue(history: list[int], at: int, k: int) -> list[int]:
    """k tokens copied from history[at:], read on through the guesses themselves where
    they reach its end: a match d tokens back repeats with period d (a loop, a list, a
    repeated line), which a copy of the d tokens left would cut short at d."""
    guesses = history[at:at + k]
    last = len(history)
    while len(guesses) < k:
        guesses.append(guesses[at + len(guesses) - last])
    return guesses
