"""What the LLM and its prompt cache ask of a model that keeps no tokens between calls
(encoders; Whisper, whose decoder brings its own cache each call)."""

from __future__ import annotations


class Uncached:
    def reset(self) -> None:
        """Nothing to reset: the model keeps no cache between calls."""

    @property
    def tokens(self) -> list[int]:
        """The ids a cache holds: none."""
        return []
