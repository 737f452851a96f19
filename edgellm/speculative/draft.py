"""A draft model's guesses (draft="small.edgellm"): not built yet; the error says so."""

from __future__ import annotations

from ..errors import ArgumentError


def draft_speculation(llm, path: str):
    raise ArgumentError(f"draft={path!r}: only draft=\"lookup\" is supported so far (a draft "
                        "model is not)")
