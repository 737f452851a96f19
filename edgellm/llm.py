"""The loaded model: `edgellm.load(path)` returns an LLM."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from . import arch
from .chat_template import ChatTemplate
from .errors import (
    ContextError,
    EdgeLLMError,
    ModelKindError,
    NonFiniteLogitsError,
    SamplingError,
    TemplateError,
    TokenizerError,
)
from .format import PackedModel
from .generate import Chunk, stream
from .guard import native
from .prompt_cache import PromptCache
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer
from .validate import check_model

DEFAULT_MAX_TOKENS = 256
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                 "repetition_context", "presence_penalty", "frequency_penalty", "logit_bias",
                 "seed")


class LLM:
    """A packed model opened for inference (weights memory-mapped, used in place)."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None,
                 context: int | None = None, precise: bool = False, chunk: int = 64,
                 kv_type: str = "f32", prompt_cache_bytes: int = 0):
        import numba

        from .numba_setup import set_threads

        self.threads = numba.config.NUMBA_NUM_THREADS if threads is None else threads
        try:
            set_threads(self.threads)
        except ValueError as e:
            raise EdgeLLMError(str(e)) from None
        self.packed = PackedModel(path)
        try:
            check_model(self.packed)  # every shape against the config, before any kernel
            self.model = arch.build(self.packed, precise=precise, context=context, chunk=chunk,
                                    kv_type=kv_type)
            if kv_type != "f32":
                self.model.fused = None  # the fused decode step reads f32 caches only
        except MemoryError:
            self.packed.close()
            raise EdgeLLMError(f"{self.packed.path}: not enough memory for the model's "
                               "buffers (try a smaller --ctx)") from None
        except BaseException:
            self.packed.close()
            raise
        self.precise = precise
        self.prompt_cache = PromptCache(self.model, prompt_cache_bytes)
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._embedder = None

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

    # text ------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (built on first use from the embedded tokenizer.json)."""
        if self._tokenizer is None:
            p = self.packed
            if not p.tokenizer_json:
                raise TokenizerError(f"{p.path}: the model file has no tokenizer (its source "
                                     "had none); pass token ids instead")
            try:
                self._tokenizer = native(
                    Tokenizer.from_json, p.tokenizer_json, p.tokenizer_config,
                    p.generation_config,
                    error=lambda m: TokenizerError(f"tokenizer.json is invalid: {m}"))
            except TokenizerError as e:
                raise TokenizerError(f"{p.path}: {e}") from None
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """The prompt string for chat `messages`, as transformers' apply_chat_template."""
        if self._template is None:
            if not self.packed.chat_template:
                raise TemplateError(f"{self.packed.path}: the model has no chat template")
            try:
                self._template = ChatTemplate(self.packed.chat_template,
                                              self.tokenizer.special_tokens)
            except TemplateError as e:
                raise TemplateError(f"{self.packed.path}: {e}") from None
        try:
            return self._template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **kwargs)
        except TemplateError as e:
            raise TemplateError(f"{self.packed.path}: {e}") from None

    def encode_prompt(self, prompt) -> list[int]:
        """A prompt -> ids: a string (special tokens added as the tokenizer says), chat
        messages (the template applied), or token ids as they are."""
        if isinstance(prompt, str):
            return self._encode(prompt, add_special_tokens=True)
        prompt = list(prompt)
        if prompt and all(isinstance(m, dict) for m in prompt):
            return self._encode(self.apply_chat_template(prompt))
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
            return [int(t) for t in prompt]
        raise EdgeLLMError("prompt must be a string, a list of chat messages or token ids")

    def _encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = native(self.tokenizer.encode, text, add_special_tokens=add_special_tokens,
                     error=lambda m: TokenizerError(f"{self.packed.path}: the tokenizer "
                                                    f"failed: {m}"))
        return self._in_vocab(ids)

    def _in_vocab(self, ids: list[int]) -> list[int]:
        """ids from the tokenizer, checked against the model's vocabulary."""
        bad = [i for i in ids if not 0 <= i < self.args.vocab_size]
        if bad:
            raise TokenizerError(f"{self.packed.path}: the tokenizer gave token id {bad[0]}, "
                                 f"outside the model's vocabulary of {self.args.vocab_size}")
        return ids

    def sampler(self, **sampling) -> Sampler:
        """A Sampler with the model's generation_config defaults, overridden by `sampling`."""
        unknown = set(sampling) - set(SAMPLING_KEYS)
        if unknown:
            raise SamplingError(f"unknown sampling parameter {sorted(unknown)[0]!r} "
                                f"(known: {', '.join(SAMPLING_KEYS)})")
        params = SamplingParams.from_generation_config(
            self.packed.generation_config, **{k: v for k, v in sampling.items() if v is not None})
        return Sampler(params, self.args.vocab_size)

    def stream_ids(self, ids: Sequence[int], max_tokens: int | None = None,
                   stop: Sequence[str] | str = (), shift: bool = True, keep_cache: bool = False,
                   **sampling) -> Iterator[Chunk]:
        """Stream a continuation of token ids (after the cache's contents if keep_cache;
        otherwise after the longest prefix of ids a cache can give: prompt_cache.py)."""
        if max_tokens is None:
            max_tokens = int(self.packed.generation_config.get("max_new_tokens")
                             or DEFAULT_MAX_TOKENS)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise SamplingError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        if not getattr(self.model, "generates", True):
            raise ModelKindError(f"{self.packed.path}: {self.packed.architecture} is an "
                                 "encoder: it computes embeddings (embed()), not text")
        stop = [stop] if isinstance(stop, str) else list(stop)
        sampler = self.sampler(**sampling)
        if not keep_cache:
            ids = self.prompt_cache.prepare(ids)
        if not ids:
            raise ContextError("empty prompt")
        history = list(self.model.tokens) + list(ids)
        return self._naming_the_file(self.prompt_cache.watch(
            stream(self.model, self.tokenizer, ids, sampler, max_tokens, stop, shift, history)))

    def _naming_the_file(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """`chunks`, with NaN or infinite logits (corrupt weights) blamed on the file."""
        try:
            yield from chunks
        except NonFiniteLogitsError as e:
            raise NonFiniteLogitsError(
                f"{self.packed.path}: the model computed {str(e).replace('logits contain ', '')}"
                " logits: its weights are probably corrupt (edgellm info --verify checks "
                "them)") from None

    def stream(self, prompt, **kwargs) -> Iterator[Chunk]:
        """Stream the continuation of `prompt` (str, chat messages or ids) as Chunks with
        .text and .token; the last also has .finish_reason and .stats. kwargs: max_tokens,
        stop, shift, temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, logit_bias, seed."""
        return self.stream_ids(self.encode_prompt(prompt), **kwargs)

    def generate(self, prompt, **kwargs) -> str:
        """The whole continuation of `prompt` as one string (see `stream`)."""
        return "".join(c.text for c in self.stream(prompt, **kwargs))

    # embeddings ------------------------------------------------------------------
    def embed(self, texts, normalize: bool | None = None, batch_size: int = 32,
              progress=None) -> np.ndarray:
        """Sentence embeddings, as sentence-transformers' encode computes them: float32
        [N, D] for a list of texts, [D] for one string. normalize: the model's default
        (its Normalize module) unless True/False. Texts longer than the model's
        max_seq_length are truncated. See edgellm/embed.py."""
        return self.embedder.embed(texts, normalize=normalize, batch_size=batch_size,
                                   progress=progress)

    def token_embeddings(self, text: str) -> np.ndarray:
        """float32 [L, D]: the final hidden state of each of `text`'s L tokens."""
        return self.embedder.token_embeddings(text)

    @property
    def embedder(self):
        if self._embedder is None:
            from .embed import Embedder

            self._embedder = Embedder(self)
        return self._embedder

    def chat(self, system: str | None = None):
        """A multi-turn ChatSession that keeps its KV cache across turns."""
        from .chat import ChatSession

        return ChatSession(self, system)

    def save_session(self, path: str | os.PathLike, messages: Sequence[dict] | None = None):
        """Save the token ids and KV cache as they stand (and `messages`) to `path`
        (session.py: atomic, checksummed, bound to this model file, kv_type and context)."""
        from .session import save_session

        return save_session(self, path, None if messages is None else
                            {"messages": [dict(m) for m in messages]})

    def load_session(self, path: str | os.PathLike):
        """Restore a saved session (SessionError, and the model unchanged, if the file is
        bad or made with another model, kv_type or context); returns it (.tokens,
        .messages)."""
        from .session import load_session

        return load_session(self, path)

    def close(self) -> None:
        self.prompt_cache = None
        self.model = None
        self.packed.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: str | os.PathLike, threads: int | None = None, context: int | None = None,
         precise: bool = False, kv_type: str = "f32", prompt_cache_bytes: int = 0) -> LLM:
    """Open a packed model file. threads: Numba threads (default: all cores); context:
    KV cache length in tokens (default: the model's, at most 4096); precise: float
    activations for quantized weights (matches the float model; slower); kv_type: how
    the KV cache stores K and V ("f32", "f16", "q8_0"); prompt_cache_bytes: memory for
    snapshots of earlier sequences whose prefixes later prompts reuse (0: only the last
    sequence's cache is reused)."""
    return LLM(path, threads=threads, context=context, precise=precise, kv_type=kv_type,
               prompt_cache_bytes=prompt_cache_bytes)


__all__ = ["LLM", "load", "EdgeLLMError"]
