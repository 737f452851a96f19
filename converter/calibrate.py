"""Calibration: run a little text through the float model and collect activation statistics.

`FloatModel(source)` converts the source to a temporary f16 file and opens it with edgellm's
own runtime (precise=True: float activations). `collect(model, chunks)` runs token chunks
through it and returns, for every linear layer, the mean of x_j^2 over all tokens for each
input column j: llama.cpp's "importance matrix". The searched quantizers weight each
column's error by it (converter/quantizers.py), so that they minimize the expected error of
the layer's output rather than of its weights.

`hooks(record=..., replace=...)` wraps the architectures' calls of the linear and embedding
kernels for the duration of a with-block: `record` collects input statistics per weight
name; `replace` runs some weights as other Tensors (size_target.py measures a tensor's
sensitivity by running it quantized inside the float model).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import shutil
import tempfile
from pathlib import Path

import numpy as np

from edgellm.errors import EdgeLLMError
from edgellm.modelfile.format import Tensor

DEFAULT_TOKENS = 2048  # calibration tokens: 4 chunks of CONTEXT
CONTEXT = 512
MIN_TOKENS = 16
MAX_MOMENT_K = 16384  # GPTQ's K x K input moments: 2 GiB of float64 at this width


class FloatModel:
    """The source converted to a temporary f16 file, opened with precise=True."""

    def __init__(self, source, context: int = 512, progress: bool = False):
        from edgellm.llm import LLM

        from .pack import convert

        self.dir = Path(tempfile.mkdtemp(prefix="edgellm-calib-"))
        try:
            path = self.dir / "float.edgellm"
            convert(source, path, "f16", progress=progress)
            self.llm = LLM(path, context=context, precise=True)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    def logits(self, ids, replace: dict[str, Tensor] | None = None) -> np.ndarray:
        """float32 [T, vocab] of one forward from an empty cache (some weights replaced)."""
        with hooks(replace=replace):
            return self.llm.logits(ids)

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
            self.llm = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> FloatModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def calibration_chunks(tokenizer, text: str, ctx: int = 512, tokens: int = DEFAULT_TOKENS
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(chunks int64 [n, <=ctx] for calibration, the text's remaining ids): up to `tokens`
    ids from the start of the text cut into chunks of ctx, BOS first where the tokenizer
    puts one before a text."""
    from edgellm.perplexity import bos_for

    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    if ids.size < MIN_TOKENS:
        raise EdgeLLMError(f"the calibration text is {ids.size} tokens; at least {MIN_TOKENS} "
                           "are needed")
    width = min(ctx, ids.size, tokens)
    n = max(1, min(tokens, ids.size) // width)
    chunks = ids[: n * width].reshape(n, width).copy()
    bos = bos_for(tokenizer)
    if bos is not None:
        chunks[:, 0] = bos
    return chunks, ids[n * width:]


def collect(model: FloatModel, chunks: np.ndarray, progress=None,
            moments: dict | None = None) -> dict[str, np.ndarray]:
    """{weight name: float32 [in_features] mean of x_j^2 over the chunks' tokens}; with a
    `moments` dict, also fills it with {weight name: float64 [K, K] mean of x x^T} (the
    input second moments GPTQ needs; for weights whose in_features <= MAX_MOMENT_K)."""
    stats: dict[str, list] = {}
    full: dict[str, list] | None = {} if moments is not None else None
    with hooks(record=stats, full=full):
        for i, chunk in enumerate(chunks):
            model.llm.logits(chunk)
            if progress is not None:
                progress(i + 1, len(chunks))
    if moments is not None:
        means = {id(e): e[0] / max(e[1], 1) for e in full.values()}  # shared ones once
        moments.update({name: means[id(e)] for name, e in full.items()})
    return {name: (s / max(n, 1)).astype(np.float32) for name, (s, n) in stats.items()}


def _arch_modules() -> list:
    import edgellm.arch as arch

    mods = [arch]
    for info in pkgutil.iter_modules(arch.__path__):
        mods.append(importlib.import_module(f"edgellm.arch.{info.name}"))
    return mods


@contextlib.contextmanager
def hooks(record: dict | None = None, replace: dict[str, Tensor] | None = None,
          full: dict | None = None):
    """Within: the architectures' linear() calls add their input's per-column sum of squares
    and row count to record[weight name] = [sums float64 [K], rows] (and x^T x to
    full[weight name] = [float64 [K, K], rows] where K <= MAX_MOMENT_K); weights named in
    `replace` (linear and embedding) run as the given Tensors instead."""
    from edgellm.kernels import linear as klinear

    real_linear, real_embedding = klinear.linear, klinear.embedding
    replace = replace or {}
    last = [None, None]  # (input buffer address and shape, weight name) of the last sum

    def linear(w, x, out, **kwargs):
        if record is not None:
            entry = record.setdefault(w.name, [np.zeros(x.shape[1], np.float64), 0])
            entry[0] += np.einsum("tk,tk->k", x, x, dtype=np.float64)
            entry[1] += x.shape[0]
        if full is not None and x.shape[1] <= MAX_MOMENT_K:
            # q/k/v (and gate/up) read the same input buffer in consecutive calls: they
            # share one moment matrix (the same list object) instead of three sums
            where = (x.__array_interface__["data"][0], x.shape)
            entry, prev = full.get(w.name), full.get(last[1])
            if entry is None and where == last[0]:
                full[w.name] = prev  # the input the last call summed
            elif not (entry is prev and where == last[0]):
                if entry is None:
                    entry = full[w.name] = [np.zeros((x.shape[1], x.shape[1])), 0]
                x64 = x.astype(np.float64)
                entry[0] += x64.T @ x64
                entry[1] += x.shape[0]
                last[:] = [where, w.name]
        return real_linear(replace.get(w.name, w), x, out, **kwargs)

    def embedding(w, ids, out):
        return real_embedding(replace.get(w.name, w), ids, out)

    saved = []
    try:
        for mod in _arch_modules():
            for attr, new, old in (("linear", linear, real_linear),
                                   ("embedding", embedding, real_embedding)):
                if getattr(mod, attr, None) is old:
                    saved.append((mod, attr, old))
                    setattr(mod, attr, new)
        yield
    finally:
        for mod, attr, old in saved:
            setattr(mod, attr, old)
