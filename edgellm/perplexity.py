"""Perplexity of a model on a text, computed as llama.cpp's perplexity tool does.

The whole text is tokenized once and cut into consecutive chunks of `ctx` tokens (a tail
shorter than a chunk is dropped). Each chunk runs from an empty cache; the first token of
each chunk is replaced by BOS when the tokenizer puts BOS before a text (llama.cpp's
add_bos rule; `bos="always"` / `"never"` override it). Only the second half of each chunk
is scored: the logits at positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1, so
every scored token has at least ctx/2 tokens of context. Only those positions go through
the output head (with a 49152-token vocabulary it costs as much as several layers): the
first half of each chunk runs without it. With the negative log-likelihoods nll_t of the N
scored tokens:

    ppl    = exp(mean(nll))
    stderr = ppl * sqrt((mean(nll^2) - mean(nll)^2) / (N - 1))   (llama.cpp's estimate)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import EdgeLLMError, ModelKindError

BOS_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class PerplexityResult:
    """ppl and its standard error over `tokens` scored tokens in `chunks` chunks of `ctx`."""

    ppl: float
    ppl_stderr: float
    tokens: int
    chunks: int
    ctx: int

    def to_json(self) -> dict:
        return {"ppl": self.ppl, "ppl_stderr": self.ppl_stderr, "tokens": self.tokens,
                "chunks": self.chunks, "ctx": self.ctx}

    def line(self) -> str:
        return (f"perplexity {self.ppl:.4f} +/- {self.ppl_stderr:.4f} over {self.tokens} tokens "
                f"({self.chunks} chunks of {self.ctx})")


def bos_for(tokenizer, bos: str = "auto") -> int | None:
    """The id to put first in each chunk, or None: under "auto", the BOS id when the
    tokenizer adds BOS before a text (llama.cpp's add_bos), else None."""
    if bos not in BOS_MODES:
        raise EdgeLLMError(f"bos must be one of {', '.join(BOS_MODES)}, not {bos!r}")
    if bos == "never" or tokenizer.bos_id is None:
        if bos == "always":
            raise EdgeLLMError("the model's tokenizer has no BOS token")
        return None
    if bos == "always":
        return int(tokenizer.bos_id)
    probe = tokenizer.encode("a", add_special_tokens=True)
    return int(tokenizer.bos_id) if probe[:1] == [tokenizer.bos_id] else None


def make_chunks(ids, ctx: int, chunks: int | None = None, bos_id: int | None = None
                ) -> np.ndarray:
    """int64 [n_chunks, ctx]: consecutive chunks of the text's ids, BOS first if given.

    `ids` is the whole text tokenized (with BOS in front when bos_id is given, as
    llama.cpp's tokenizer call adds it). At least 2 * ctx ids are needed.
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ctx < 4:
        raise EdgeLLMError(f"ctx must be at least 4, got {ctx}")
    if chunks is not None and chunks < 1:
        raise EdgeLLMError(f"chunks must be at least 1, got {chunks}")
    if ids.size < 2 * ctx:
        raise EdgeLLMError(f"the text is {ids.size} tokens; perplexity with a context of {ctx} "
                           f"needs at least {2 * ctx}")
    n = ids.size // ctx if chunks is None else min(chunks, ids.size // ctx)
    out = ids[: n * ctx].reshape(n, ctx).copy()
    if bos_id is not None:
        out[:, 0] = bos_id
    return out


def chunk_nll(logits: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """float64 [ctx - ctx/2 - 1]: -log p(token t+1 | ..t) for t = ctx/2 .. ctx-2.

    logits: [n, vocab], the model's output at the last n positions of the chunk
    (ctx - n .. ctx - 1); n = ctx (every position) or at least ctx - ctx/2."""
    ctx = chunk.shape[0]
    first = ctx // 2
    n = logits.shape[0]
    if not ctx - first <= n <= ctx:
        raise EdgeLLMError(f"expected logits for {ctx} positions (or at least the last "
                           f"{ctx - first}), got {n}")
    start = ctx - n
    z = np.asarray(logits[first - start:ctx - 1 - start], dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    target = chunk[first + 1:ctx]
    return lse - z[np.arange(z.shape[0]), target]


def scored_logits(llm, chunk: np.ndarray) -> np.ndarray:
    """float32 [n, vocab]: logits of the last n positions of one forward over `chunk` from
    an empty cache, n = ctx - s with s the largest multiple of the prefill piece <= ctx/2.

    Positions before s run without the output head. The prefill pieces are those of a
    whole forward (llm.logits), so the logits are the same numbers, bit for bit."""
    model = llm._model()
    chunk = np.ascontiguousarray(chunk, dtype=np.int64).reshape(-1)
    ctx = chunk.size
    if ctx > model.context:
        raise EdgeLLMError(f"a chunk of {ctx} tokens does not fit the context of "
                           f"{model.context}")
    first = ctx // 2
    start = first - first % max(int(model.chunk), 1)
    with llm.lifetime.exclusive():  # the cache is ours for the chunk (lifetime.py)
        model.reset()
        if start:
            model.forward(chunk[:start], want="none", shift=False)
        return model.forward(chunk[start:], want="all", shift=False)


def summarize(nll: np.ndarray, chunks: int, ctx: int) -> PerplexityResult:
    """PerplexityResult of the scored tokens' negative log-likelihoods."""
    nll = np.asarray(nll, dtype=np.float64).reshape(-1)
    n = nll.size
    mean = float(nll.mean())
    ppl = float(np.exp(mean))
    var = float(np.mean(nll * nll)) - mean * mean
    stderr = ppl * float(np.sqrt(var / (n - 1))) if n > 1 and var > 0 else 0.0
    return PerplexityResult(ppl, stderr, n, chunks, ctx)


def evaluate(logits_fn: Callable[[np.ndarray], np.ndarray], chunks: np.ndarray,
             progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Score every chunk with logits_fn(chunk ids [ctx]) -> logits [n, vocab] of the chunk's
    last n positions (chunk_nll); progress(i, n, running ppl) after each chunk."""
    n, ctx = chunks.shape
    parts = []
    for i, chunk in enumerate(chunks):
        parts.append(chunk_nll(logits_fn(chunk), chunk))
        if progress is not None:
            progress(i + 1, n, float(np.exp(np.concatenate(parts).mean())))
    return summarize(np.concatenate(parts), n, ctx)


def perplexity(llm, text: str, ctx: int = 512, chunks: int | None = None, bos: str = "auto",
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of `llm` (an edgellm.LLM whose context is at least ctx) on `text`."""
    if not getattr(llm._model(), "generates", True):
        raise ModelKindError(f"{llm.packed.path}: {llm.packed.architecture} is an encoder: it "
                             "computes embeddings, not the next token's probabilities "
                             "(perplexity needs a decoder)")
    if llm.context < ctx:
        raise EdgeLLMError(f"the model was opened with a context of {llm.context}, "
                           f"smaller than ctx {ctx}")
    tok = llm.tokenizer
    bos_id = bos_for(tok, bos)
    ids = tok.encode(text)
    if bos_id is not None and bos == "auto":
        ids = [bos_id] + ids  # the tokenizer's own BOS, as llama.cpp's tokenize adds it
    return evaluate(lambda c: scored_logits(llm, c), make_chunks(ids, ctx, chunks, bos_id),
                    progress)
