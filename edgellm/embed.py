"""Sentence embeddings, as sentence-transformers computes them: tokenize (truncated to
max_seq_length), run the model, pool the token embeddings, optionally L2-normalize.

    Embedder(llm).embed(texts, normalize=None, batch_size=32) -> float32 [N, D]

The pooling comes from the packed file's "embedding" header entry (convert-model reads it
from sentence-transformers' modules.json / 1_Pooling/config.json); an encoder without one
pools by mean without normalizing, as sentence-transformers does for a plain Hugging Face
model. Encoders run `batch_size` texts at a time packed into one sequence of tokens (no
padding: arch/bert.py); decoders (last-token or mean pooling, the Qwen3-Embedding layout)
run one text at a time through their KV cache, taking the final norm's hidden states.

Pooling over a sequence's token embeddings h [L, D] (no padding, so no mask):
    mean   h.mean(0)                  cls        h[0]
    max    h.max(0)                   lasttoken  h[L - 1]
    mean_sqrt_len_tokens  h.sum(0) / sqrt(L)
    weightedmean          sum_i (i + 1) h[i] / sum_i (i + 1)
normalize: v / max(||v||, 1e-12), as torch.nn.functional.normalize.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from . import arguments
from .errors import ArgumentError, ContextError, FormatError, ModelKindError

POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean")
DEFAULT_BATCH = 32  # texts per encoder batch (sentence-transformers' default batch size)
PROGRESS_MIN = 256  # texts from which the CLI shows a progress bar


@dataclass(frozen=True)
class Pooling:
    """How token embeddings become one vector (the packed file's "embedding" entry)."""

    mode: str
    normalize: bool
    max_seq_length: int | None

    @classmethod
    def of(cls, packed, encoder: bool) -> Pooling:
        """The pooling a packed file declares; an encoder's default without one; a
        ModelKindError for a decoder without one."""
        where = str(packed.path)
        entry = packed.header.get("embedding")
        if entry is None:
            if not encoder:
                raise ModelKindError(
                    f"{where}: {packed.architecture} is a text generator with no pooling "
                    "configuration: it cannot embed (convert a sentence-transformers "
                    "directory, with modules.json and 1_Pooling/config.json)")
            return cls("mean", False, None)
        if not isinstance(entry, dict):
            raise FormatError(f"{where}: header field 'embedding' is not an object")
        mode, norm, length = (entry.get("pooling"), entry.get("normalize", False),
                              entry.get("max_seq_length"))
        if mode not in POOLING_MODES:
            raise FormatError(f"{where}: header field embedding.pooling is {mode!r} "
                              f"(known: {', '.join(POOLING_MODES)})")
        if not isinstance(norm, bool):
            raise FormatError(f"{where}: header field embedding.normalize is {norm!r}")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                                   or length < 2):
            raise FormatError(f"{where}: header field embedding.max_seq_length is {length!r}")
        return cls(mode, norm, length)


def pool(h: np.ndarray, mode: str) -> np.ndarray:
    """One sequence's token embeddings h float32 [L, D] -> [D]."""
    if mode == "mean":
        return h.mean(axis=0, dtype=np.float32)
    if mode == "cls":
        return h[0].copy()
    if mode == "lasttoken":
        return h[-1].copy()
    if mode == "max":
        return h.max(axis=0)
    if mode == "mean_sqrt_len_tokens":
        return h.sum(axis=0, dtype=np.float32) / np.float32(np.sqrt(h.shape[0]))
    if mode == "weightedmean":
        w = np.arange(1, h.shape[0] + 1, dtype=np.float32)
        return (w @ h) / w.sum()
    raise ValueError(f"unknown pooling mode {mode!r}")


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """x [N, D] / max(||x||, 1e-12), row by row, in place; returns x."""
    norms = np.sqrt(np.einsum("nd,nd->n", x, x, dtype=np.float32))
    x /= np.maximum(norms, np.float32(1e-12))[:, None]
    return x


class Embedder:
    """Embeddings from an LLM's model (an encoder, or a decoder with pooling)."""

    def __init__(self, llm):
        self.llm = llm
        purpose = getattr(llm.model, "purpose", None)  # a model of another kind (Whisper)
        if purpose is not None:
            raise ModelKindError(f"{llm.packed.path}: {llm.packed.architecture} is {purpose}")
        self.encoder = not getattr(llm.model, "generates", True)
        self.pooling = Pooling.of(llm.packed, self.encoder)
        context = llm.model.context
        self.max_length = min(self.pooling.max_seq_length or context, context)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with the tokenizer's special tokens, truncated to max_length."""
        tok = self.llm.tokenizer
        return [self.llm._in_vocab(ids) for ids in
                tok.encode_truncated(list(texts), self.max_length)]

    def token_embeddings(self, text: str) -> np.ndarray:
        """float32 [L, D]: the model's final hidden states of one text."""
        ids = self.tokenize([_check_text(text)])[0]
        return self._hidden([ids])[0].copy()

    def embed(self, texts, normalize: bool | None = None, batch_size: int = DEFAULT_BATCH,
              progress: Callable[[int], None] | None = None) -> np.ndarray:
        """float32 [N, D] for a list of texts, [D] for one string (see the module doc).
        normalize: the model's default (its Normalize module) unless True/False;
        progress: called with the number of texts done after each batch."""
        single = isinstance(texts, str)
        items = [_check_text(texts)] if single else _check_texts(texts)
        if normalize is not None and not isinstance(normalize, bool):
            raise ArgumentError(f"normalize must be True, False or None, got {normalize!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ArgumentError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if progress is not None and not callable(progress):
            raise ArgumentError(f"progress must be a callable or None, got {progress!r:.40}")
        D = self.llm.args.hidden_size
        out = np.zeros((len(items), D), np.float32)
        step = batch_size if self.encoder else 1
        for s in range(0, len(items), step):
            batch = self.tokenize(items[s:s + step])
            for j, h in enumerate(self._hidden(batch)):
                out[s + j] = pool(h, self.pooling.mode)
            if progress is not None:
                progress(min(s + step, len(items)))
        if self.pooling.normalize if normalize is None else normalize:
            normalize_rows(out)
        return out[0] if single else out

    def _hidden(self, batch: list[list[int]]) -> list[np.ndarray]:
        """The hidden states [L, D] of each sequence of ids (views, valid until the next
        call for encoders)."""
        model = self.llm.model
        if self.encoder:
            lengths = np.array([len(ids) for ids in batch], np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            hidden = model.encode(np.fromiter((i for ids in batch for i in ids), np.int64,
                                              int(offsets[-1])), offsets)
            return [hidden[offsets[k]:offsets[k + 1]] for k in range(len(batch))]
        out = []
        for ids in batch:
            if not ids:
                raise ContextError("the tokenizer gave no tokens for a text")
            model.reset()
            out.append(model.forward(np.array(ids, np.int64), want="hidden", shift=False))
        model.reset()
        return out


def _check_text(text, name: str = "text") -> str:
    """A str of valid Unicode (ArgumentError naming it otherwise: a lone surrogate too)."""
    return arguments.text(text, name)


def _check_texts(texts) -> list[str]:
    """A list or tuple of str. Anything else is refused by type rather than iterated: a
    dict would embed its keys, a set in no stated order, a generator be used up by the
    check; bytes need decoding."""
    if not isinstance(texts, (list, tuple)):
        hint = (" (decode bytes to str first)" if isinstance(texts, (bytes, bytearray))
                else "" if isinstance(texts, Mapping) or not hasattr(texts, "__iter__")
                else " (pass a list of its texts)")
        raise ArgumentError(f"texts must be a str or a list of str, got "
                            f"{type(texts).__name__}{hint}")
    return [_check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
