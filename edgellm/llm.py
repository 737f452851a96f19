"""The loaded model: `edgellm.load(path)` returns an LLM."""

from __future__ import annotations

import os

import numpy as np

from . import arch
from .errors import ContextError, EdgeLLMError
from .format import PackedModel


class LLM:
    """A packed model opened for inference (weights memory-mapped, used in place)."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None,
                 context: int | None = None, precise: bool = False, chunk: int = 64):
        from .numba_setup import set_threads

        self.threads = set_threads(threads)
        self.packed = PackedModel(path)
        try:
            self.model = arch.build(self.packed, precise=precise, context=context, chunk=chunk)
        except BaseException:
            self.packed.close()
            raise
        self.precise = precise
        self._tokenizer = None

    @property
    def config(self) -> dict:
        """The model's Hugging Face config (as stored in the file)."""
        return self.packed.config

    @property
    def args(self):
        return self.model.args

    @property
    def context(self) -> int:
        return self.model.context

    def logits(self, token_ids) -> np.ndarray:
        """float32 [T, vocab]: one forward over `token_ids` from an empty cache."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size > self.model.context:
            raise ContextError(f"{ids.size} tokens do not fit the context of "
                               f"{self.model.context}")
        self.model.reset()
        return self.model.forward(ids, want="all", shift=False)

    def close(self) -> None:
        self.model = None
        self.packed.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: str | os.PathLike, threads: int | None = None, context: int | None = None,
         precise: bool = False) -> LLM:
    """Open a packed model file. threads: Numba threads (default: all cores); context:
    KV cache length in tokens (default: the model's, at most 4096); precise: float
    activations for quantized weights (matches the float model; slower)."""
    return LLM(path, threads=threads, context=context, precise=precise)


__all__ = ["LLM", "load", "EdgeLLMError"]
