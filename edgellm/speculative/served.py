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
