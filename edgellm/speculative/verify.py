"""The verify step: a sequence's next n tokens as n rows of the batched decode step over
the model's own cache (step/batched.py, one slot repeated), each weight block read once
for all of them; row j's logits are the single decode step's at position p + j, bit for
bit (tests/test_speculative_verify.py)."""

from __future__ import annotations

import numpy as np

from ..step.batched import BatchDecoder, check_rows

# the types whose interleaved tiles add a row's sums as the single step's tiles do (bit
# for bit: step/batched.py); q8_0's do not, so q8_0 matrices are read from the file
EXACT_INTERLEAVED = ("q4_0", "q4_1")


class Verifier:
    """Runs up to `rows` tokens of `model`'s sequence a step (the model's kv_spare must be
    at least rows - 1: KVCache spare)."""

    def __init__(self, model, rows: int):
        self.model, self.rows = model, rows
        self.stepper: BatchDecoder | None = None

    @classmethod
    def usable(cls, model) -> bool:
        """Whether the model has the fused step the verify step runs."""
        return getattr(model, "fused", None) is not None

    def fits(self, n: int) -> bool:
        """Whether n rows can run now without a context shift between them."""
        if not 1 <= n <= self.rows:
            return False
        try:
            check_rows(self.model.cache, n)
        except ValueError:
            return False
        return True

    def run(self, tokens: list[int]) -> np.ndarray:
        """Logits [n, vocab] (a new array) of tokens run at the cache's next n positions;
        the cache and model.tokens advance by n (fits(n) must hold)."""
        m = self.model
        s = self.stepper
        if s is None or not s.current or s.caches[0] is not m.cache:
            # the model's step was rebuilt (LoRA) or its cache replaced: a new stepper
            s = self.stepper = BatchDecoder(m, [m.cache], interleave=EXACT_INTERLEAVED,
                                            rows=self.rows)
        logits = s.step([0] * len(tokens), tokens)
        m.tokens.extend(tokens)
        return logits
