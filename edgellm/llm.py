"""The loaded model: `edgellm.load(path)` returns an LLM.

An LLM runs one generation at a time and refuses everything once closed (ClosedError):
see lifetime.py. Every public method checks its arguments (arguments.py) and takes the
model's turn (`self.lifetime`) before it touches the weights or the cache.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from . import arch, arguments, loader
from .cache.kv_types import DEFAULT_KV_TYPE
from .cache.prompt_cache import PromptCache
from .errors import (
    ClosedError,
    ContextError,
    ContextWarning,
    EdgeLLMError,
    ModelKindError,
    NonFiniteLogitsError,
    SamplingError,
    TemplateError,
    TokenizerError,
)
from .generate import Chunk, stream
from .lifetime import Lifetime, Stream, Turn
from .memory_plan import CHUNK
from .modelfile.format import PackedModel
from .runtime.guard import native
from .sampling import Sampler, SamplingParams
from .speculative.loop import ROWS
from .text.tokenizer import Tokenizer
from .validate import check_model

DEFAULT_MAX_TOKENS = 256
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                 "repetition_context", "presence_penalty", "frequency_penalty", "logit_bias",
                 "seed")
CONSTRAINT_KEYS = ("response_format", "json_schema", "regex", "grammar", "choices")


class LLM:
    """A packed model opened for inference (weights memory-mapped, used in place)."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None,
                 context: int | None = None, precise: bool = False, chunk: int = CHUNK,
                 kv_type: str = DEFAULT_KV_TYPE, prompt_cache_bytes: int = 0, fused: bool = True,
                 lora=None, act_type: str = "int16", draft: str | None = None):
        import numba

        from .runtime.numba_setup import set_threads

        path = arguments.file_path(path)
        threads = arguments.integer(threads, "threads", 1, none=True)
        context = arguments.integer(context, "context", 8, 1 << 24, none=True)  # as validate.py
        precise = arguments.flag(precise, "precise")
        act_type = arguments.choice(act_type, "act_type", tuple(arch.ACT_TYPES))
        fused = arguments.flag(fused, "fused")
        chunk = arguments.integer(chunk, "chunk", 1)
        prompt_cache_bytes = arguments.integer(prompt_cache_bytes, "prompt_cache_bytes", 0)
        draft = _draft_argument(draft)
        self.threads = numba.config.NUMBA_NUM_THREADS if threads is None else threads
        try:
            set_threads(self.threads)
        except ValueError as e:
            raise EdgeLLMError(str(e)) from None
        self.model = None
        self.packed = PackedModel(path)
        self.lifetime = Lifetime(str(self.packed.path))
        try:
            args = check_model(self.packed)  # every shape against the config, before any kernel
            self._check_context(context)
            self.model = loader.build(self.packed, precise=precise, context=context,
                                      chunk=chunk, kv_type=kv_type, fused=fused,
                                      act_dtype=arch.ACT_TYPES[act_type], args=args,
                                      kv_spare=ROWS - 1 if draft is not None else 0)
        except (MemoryError, OSError) as e:
            self.packed.close()
            if isinstance(e, OSError) and e.errno != errno.ENOMEM:
                raise
            raise EdgeLLMError(f"{self.packed.path}: not enough memory for the model's "
                               "buffers (try a smaller --ctx)") from None
        except BaseException:
            self.packed.close()
            raise
        self.precise = precise
        self.prompt_cache = PromptCache(self.model, prompt_cache_bytes)
        self._tokenizer: Tokenizer | None = None
        self._template = None  # a chat_template.ChatTemplate, made on first use
        self._engine = None  # constraints.ConstraintEngine, built on first use
        self._embedder = None
        self._heads = None  # heads.Heads, made on first use
        self.lora: list[tuple[str, float]] = []  # the active adapters: (path, scale)
        self.draft = draft
        if draft is not None:
            try:
                self.speculation = self._speculation(draft)
            except BaseException:
                self.close()
                raise
        if lora is not None:
            try:
                self._set_lora(lora)
            except BaseException:
                self.close()
                raise

    speculation = None  # speculative.Speculation: how this model guesses tokens (draft=)

    def _speculation(self, draft: str):
        """The Speculation `draft` asks for: "lookup" (None where the model has no fused
        step to verify with: generation is then plain), or a draft model's file."""
        from .speculative import Speculation

        if draft == "lookup":
            return Speculation.lookup(self.model)
        from .speculative.draft import draft_speculation

        return draft_speculation(self, draft)

    def _check_context(self, context: int | None) -> None:
        """Warn of a context beyond the positions the model was trained for (its output
        there is noise; the command lines turn the warning into an error)."""
        limit = self.packed.config.get("max_position_embeddings")
        if context is not None and isinstance(limit, int) and context > limit:
            warnings.warn(f"{self.packed.path}: context {context} is beyond the model's "
                          f"max_position_embeddings of {limit}", ContextWarning, stacklevel=4)

    def _model(self):
        """The model, or ClosedError."""
        model = self.model
        if model is None:
            self.lifetime.check()
            raise ClosedError(f"{self.packed.path}: the model is closed")
        return model

    @property
    def closed(self) -> bool:
        return self.lifetime.closed

    @property
    def config(self) -> dict:
        """The model's Hugging Face config (as stored in the file)."""
        self.lifetime.check()
        return self.packed.config

    @property
    def args(self):
        return self._model().args

    @property
    def context(self) -> int:
        return self._model().context

    def logits(self, token_ids, *, blocking: bool = True,
               timeout: float | None = None) -> np.ndarray:
        """float32 [T, vocab]: one forward over `token_ids` from an empty cache. blocking,
        timeout: whether and how long to wait while another thread generates (BusyError)."""
        model = self._model()
        ids = np.array(arguments.token_ids(token_ids, model.args.vocab_size), dtype=np.int64)
        if ids.size == 0:
            raise ContextError("no tokens to run")
        if ids.size > model.context:
            raise ContextError(f"{ids.size} tokens do not fit the context of "
                               f"{model.context}")
        with self.lifetime.exclusive(blocking, timeout):
            model.reset()
            return model.forward(ids, want="all", shift=False)

    # LoRA ------------------------------------------------------------------------
    def set_lora(self, lora=None, *, blocking: bool = True,
                 timeout: float | None = None) -> None:
        """Switch LoRA adapters without reloading the base: `lora` is a PEFT directory or
        an adapter file (convert-model --adapter), a list of them or of (path, scale)
        pairs, or None (no adapter). Every adapter is read and checked against the model
        before anything changes (AdapterError); then the KV cache and the prompt cache are
        emptied, since what they hold was computed with the previous adapters."""
        self._model()
        with self.lifetime.exclusive(blocking, timeout):
            self._set_lora(lora)

    def _set_lora(self, lora) -> None:
        from .lora import adapter_list, open_adapter
        from .lora.attach import stack

        model = self._model()
        specs = adapter_list(lora)
        deltas = stack(model, [(open_adapter(path), scale) for path, scale in specs])
        model.set_lora(deltas)
        self.prompt_cache.clear()
        self.lora = specs

    # text ------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (built on first use from the file's stored tokenizer)."""
        self.lifetime.check()
        if self._tokenizer is None:
            p = self.packed
            if not p.has_tokenizer:
                raise TokenizerError(f"{p.path}: the model file has no tokenizer (its source "
                                     "had none); pass token ids instead")
            try:
                self._tokenizer = native(
                    Tokenizer.from_packed, p,
                    error=lambda m: TokenizerError(f"tokenizer.json is invalid: {m}"))
            except TokenizerError as e:
                raise TokenizerError(f"{p.path}: {e}") from None
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """The prompt string for chat `messages`, as transformers' apply_chat_template.
        (Its special-token text is the template's and the messages' alike: encode_chat
        tokenizes the messages' as text.)"""
        return self._chat_text(messages, add_generation_prompt, True, **kwargs)[0]

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    parse_special: bool = False, **kwargs) -> list[int]:
        """The token ids of chat `messages` with the chat template applied. The template's
        special tokens (<|im_start|>...) are control tokens; the same text inside the
        messages (their content, names, tools...) is tokenized as text, so that no message
        can forge a turn, unless parse_special=True (text the caller means as tokens)."""
        text, literal = self._chat_text(messages, add_generation_prompt, parse_special,
                                        **kwargs)
        return self._encode(text, literal=literal)

    def _chat_text(self, messages, add_generation_prompt: bool, parse_special: bool,
                   **kwargs) -> tuple[str, list[tuple[int, int]]]:
        """The rendered chat and the spans of special-token text in it that came from the
        messages (none with parse_special): ChatTemplate.render_literal."""
        self.lifetime.check()
        arguments.flag(add_generation_prompt, "add_generation_prompt")
        parse_special = arguments.flag(parse_special, "parse_special")
        if isinstance(messages, (str, bytes, bytearray)) or not isinstance(messages, Sequence):
            raise arguments.ArgumentError(f"messages must be a list of dicts, got "
                                          f"{type(messages).__name__}")
        if not all(isinstance(m, dict) for m in messages):
            raise arguments.ArgumentError("messages must be a list of dicts")
        messages = [_chat_message(i, m) for i, m in enumerate(messages)]
        if self._template is None:
            if not self.packed.chat_template:
                raise TemplateError(f"{self.packed.path}: the model has no chat template")
            from .text.chat_template import ChatTemplate  # jinja2: only for chat prompts

            try:
                self._template = ChatTemplate(self.packed.chat_template,
                                              self.tokenizer.special_tokens)
            except TemplateError as e:
                raise TemplateError(f"{self.packed.path}: {e}") from None
        try:
            if parse_special:
                return self._template.render(
                    messages, add_generation_prompt=add_generation_prompt, **kwargs), []
            return self._template.render_literal(
                messages, self.tokenizer.special_texts,
                add_generation_prompt=add_generation_prompt, **kwargs)
        except TemplateError as e:
            raise TemplateError(f"{self.packed.path}: {e}") from None

    def encode_prompt(self, prompt, parse_special: bool = False) -> list[int]:
        """A prompt -> ids: a string (special tokens added as the tokenizer says, and its
        special-token text read as tokens: the caller wrote it), chat messages (encode_chat:
        the template applied; special-token text in the messages read as text unless
        parse_special), or token ids as they are."""
        self.lifetime.check()
        parse_special = arguments.flag(parse_special, "parse_special")
        if isinstance(prompt, str):
            return self._encode(prompt, add_special_tokens=True)
        if isinstance(prompt, (list, tuple)) and prompt \
                and all(isinstance(m, dict) for m in prompt):
            return self.encode_chat(prompt, parse_special=parse_special)
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return arguments.token_ids(prompt, self.args.vocab_size, "prompt token ids")
        raise arguments.ArgumentError(
            f"prompt must be a str, a list of chat messages or a list of token ids, got "
            f"{type(prompt).__name__}"
            + (" (decode bytes to str first)" if isinstance(prompt, (bytes, bytearray))
               else ""))

    def _encode(self, text: str, add_special_tokens: bool = False,
                literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """text -> ids, special-token text inside the `literal` spans read as text."""
        text = arguments.text(text, "prompt")
        ids = native(self.tokenizer.encode, text, add_special_tokens=add_special_tokens,
                     literal=literal,
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
        self.lifetime.check()
        unknown = set(sampling) - set(SAMPLING_KEYS)
        if unknown:
            raise SamplingError(f"unknown sampling parameter {sorted(unknown)[0]!r} "
                                f"(known: {', '.join(SAMPLING_KEYS)})")
        params = SamplingParams.from_generation_config(
            self.packed.generation_config, **{k: v for k, v in sampling.items() if v is not None})
        return Sampler(params, self.args.vocab_size)

    @property
    def constraint_engine(self):
        """The constraint engine for this model's tokenizer (built on first use)."""
        if self._engine is None:
            from .text.constraints import ConstraintEngine

            self._engine = ConstraintEngine(self.tokenizer.to_json(),
                                            self.args.vocab_size, self.tokenizer.eos_ids)
        return self._engine

    def constraint(self, spec=None, **kwargs):
        """A Constraint for a ConstraintSpec or for response_format=, json_schema=, regex=,
        grammar=, choices= (None if none is given); ConstraintError if it is invalid."""
        from .text.constraints import spec_from

        spec = spec if spec is not None else spec_from(**kwargs)
        return None if spec is None else self.constraint_engine.compile(spec)

    def create_chat_completion(self, messages, **kwargs):
        """OpenAI's chat.completion dict for chat `messages` (chat.completion.chunk dicts
        with stream=True). kwargs: tools, tool_choice, response_format, stream, max_tokens,
        stop, enable_thinking, chat_template_kwargs, max_reasoning_tokens, parse_special
        (see encode_chat) and sampling (see edgellm/chat_completion.py)."""
        from .chat_completion import create_chat_completion

        return create_chat_completion(self, messages, **kwargs)

    def stream_ids(self, ids: Sequence[int], max_tokens: int | None = None,
                   stop: Sequence[str] | str = (), shift: bool = True, keep_cache: bool = False,
                   constraint=None, *, blocking: bool = True, timeout: float | None = None,
                   _turn: Turn | None = None, **sampling) -> Stream[Chunk]:
        """Stream a continuation of token ids (after the cache's contents if keep_cache;
        otherwise after the longest prefix of ids a cache can give: prompt_cache.py).
        The output follows `constraint` (a Constraint) or the one response_format=,
        json_schema=, regex=, grammar= or choices= asks for. The stream holds the model
        until it ends (see lifetime.py); `_turn`: one the caller already holds
        (ChatSession), else one is taken (blocking, timeout)."""
        model = self._model()
        asked = {k: sampling.pop(k) for k in CONSTRAINT_KEYS if k in sampling}
        speculative = arguments.flag(sampling.pop("speculative", True), "speculative")
        ids = arguments.token_ids(ids, model.args.vocab_size, "prompt token ids")
        if max_tokens is None:
            max_tokens = int(self.packed.generation_config.get("max_new_tokens")
                             or DEFAULT_MAX_TOKENS)
        if isinstance(max_tokens, np.integer) and not isinstance(max_tokens, np.bool_):
            max_tokens = int(max_tokens)  # a numpy int, as the sampling values take them
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise SamplingError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        if not getattr(model, "generates", True):
            raise ModelKindError(f"{self.packed.path}: {self.packed.architecture} is " + getattr(
                model, "purpose", "an encoder: it computes embeddings (embed()), not text"))
        stop = arguments.stops(stop)
        shift = arguments.flag(shift, "shift")
        keep_cache = arguments.flag(keep_cache, "keep_cache")
        sampler = self.sampler(**sampling)
        if constraint is None and asked:
            constraint = self.constraint(**asked)  # refused here, before any token
        tokenizer = self.tokenizer
        if not ids:
            raise ContextError("empty prompt")
        spec = self.speculation if speculative else None
        if _turn is not None:  # the caller's turn: it wraps the chunks in its own Stream
            return self._chunks(model, tokenizer, ids, sampler, max_tokens, stop, shift,
                                keep_cache, constraint, spec)
        turn = self.lifetime.acquire(blocking, timeout)
        return self.lifetime.stream(turn, self._chunks(model, tokenizer, ids, sampler,
                                                       max_tokens, stop, shift, keep_cache,
                                                       constraint, spec))

    def _chunks(self, model, tokenizer, ids, sampler, max_tokens, stop, shift,
                keep_cache, constraint=None, spec=None) -> Iterator[Chunk]:
        """The generation itself (runs under a turn: its first step sets up the cache,
        reusing the longest prefix of `ids` it or the prompt cache holds); `spec`: the
        Speculation to decode with, or None."""
        if not keep_cache:
            ids = self.prompt_cache.prepare(ids)
        history = list(model.tokens) + list(ids)
        yield from self._naming_the_file(self.prompt_cache.watch(
            stream(model, tokenizer, ids, sampler, max_tokens, stop, shift, history,
                   constraint, spec)))

    def _naming_the_file(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """`chunks`, with NaN or infinite logits blamed on the LoRA adapters when some are
        active (the base's weights are checksummed, an adapter's size is not), else on
        the model file (corrupt weights)."""
        try:
            yield from chunks
        except NonFiniteLogitsError as e:
            what = str(e).replace("logits contain ", "")
            active = [path for path, scale in self.lora if scale != 0.0]
            if active:
                raise NonFiniteLogitsError(
                    f"{', '.join(active)}: the model computed {what} logits with this LoRA "
                    f"adapter{'s' if len(active) > 1 else ''}: its weights are probably too "
                    "large (try without it: set_lora(None), no --lora)") from None
            raise NonFiniteLogitsError(
                f"{self.packed.path}: the model computed {what} logits: its weights are "
                "probably corrupt (edgellm info --verify checks them)") from None

    def stream(self, prompt, parse_special: bool = False, **kwargs) -> Stream[Chunk]:
        """Stream the continuation of `prompt` (str, chat messages or ids) as Chunks with
        .text and .token; the last also has .finish_reason and .stats. kwargs: max_tokens,
        stop, shift, temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, logit_bias, seed; one constraint of
        response_format, json_schema, regex, grammar (Lark or GBNF), choices; blocking,
        timeout (waiting for another thread's generation); parse_special: chat messages'
        special-token text read as the tokens (default: as text; see encode_chat);
        speculative=False: decode one token a step although the model was loaded with a
        draft (the output is the same either way). The stream holds the model until it
        is exhausted or closed: README "Threads and lifetimes"."""
        return self.stream_ids(self.encode_prompt(prompt, parse_special), **kwargs)

    def generate(self, prompt, **kwargs) -> str:
        """The whole continuation of `prompt` as one string (see `stream`)."""
        with self.stream(prompt, **kwargs) as chunks:
            return "".join(c.text for c in chunks)

    # embeddings ------------------------------------------------------------------
    def embed(self, texts, normalize: bool | None = None, batch_size: int = 32,
              progress=None, *, blocking: bool = True,
              timeout: float | None = None) -> np.ndarray:
        """Sentence embeddings, as sentence-transformers' encode computes them: float32
        [N, D] for a list of texts, [D] for one string. normalize: the model's default
        (its Normalize module) unless True/False. Texts longer than the model's
        max_seq_length are truncated. blocking, timeout: waiting for another thread's
        generation, as LLM.stream. See edgellm/embed.py."""
        with self.lifetime.exclusive(blocking, timeout):  # the model is ours for the call
            return self.embedder.embed(texts, normalize=normalize, batch_size=batch_size,
                                       progress=progress)

    def transcribe(self, audio, language: str | None = None, task: str = "transcribe", *,
                   beam_size: int = 5, temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
                   vad: bool = False, initial_prompt=None, word_timestamps: bool = False,
                   **options):
        """Speech to text with a Whisper model: (segments, info), as faster-whisper returns
        them. audio: a file's path (WAV; mp3, m4a, ogg, flac, webm with the `audio` extra),
        WAV bytes, or float32 samples at 16 kHz; language: a code ("en", "de", ...) or None
        to detect it; task: "transcribe" or "translate"; beam_size: beams at temperature 0
        (1: greedy); temperature: tried in turn while a window's compression ratio is over
        compression_ratio_threshold (2.4) or its average log-probability under
        log_prob_threshold (-1), sampling best_of (5) at t > 0 (seed: 0); vad: skip what
        voice-activity detection finds silent before decoding; initial_prompt: text (or token
        ids) the first window continues; a window whose no-speech probability exceeds
        no_speech_threshold (0.6) while its average log-probability is under
        log_prob_threshold is silence (skipped). More options: edgellm/transcribe.py's
        transcribe(). segments is a Stream that holds the model until it is consumed or
        closed."""
        from .transcribe import transcribe

        return transcribe(self, audio, language, task, beam_size=beam_size,
                          temperature=temperature, vad=vad, initial_prompt=initial_prompt,
                          word_timestamps=word_timestamps, **options)

    def token_embeddings(self, text: str, *, blocking: bool = True,
                         timeout: float | None = None) -> np.ndarray:
        """float32 [L, D]: the final hidden state of each of `text`'s L tokens."""
        with self.lifetime.exclusive(blocking, timeout):
            return self.embedder.token_embeddings(text)

    # task heads (cross-encoders, classifiers, taggers: see edgellm/heads.py) -------------
    def rerank(self, query: str, documents, top_n: int | None = None,
               return_documents: bool = False, *, blocking: bool = True,
               timeout: float | None = None) -> list[dict]:
        """Documents scored against `query` by a cross-encoder, as sentence-transformers'
        CrossEncoder scores pairs, best first: [{"index", "relevance_score",
        "document": {"text"} (with return_documents)}], at most top_n of them."""
        with self.lifetime.exclusive(blocking, timeout):
            return self.heads.rerank(query, documents, top_n, return_documents)

    def classify(self, texts, top_k: int | None = 1, *, blocking: bool = True,
                 timeout: float | None = None):
        """Labels of a text classifier, as transformers' text-classification pipeline:
        {"label", "score"} per text (top_k=1), or the top_k best sorted (None: all)."""
        with self.lifetime.exclusive(blocking, timeout):
            return self.heads.classify(texts, top_k)

    def entities(self, text: str, *, blocking: bool = True,
                 timeout: float | None = None) -> list[dict]:
        """Named entities of a token classifier: [{"entity_group", "score", "word", "start",
        "end"}], grouped as transformers' pipeline with aggregation_strategy="simple"."""
        with self.lifetime.exclusive(blocking, timeout):
            return self.heads.entities(text)

    @property
    def heads(self):
        """The model's task heads (heads.Heads); `llm.heads.kind` says which calls it
        answers: "reranker", "classifier", "tagger", "embedding" or "generator"."""
        self.lifetime.check()
        if self._heads is None:
            from .heads import Heads

            self._heads = Heads(self)
        return self._heads

    @property
    def embedder(self):
        self.lifetime.check()
        if self._embedder is None:
            from .embed import Embedder

            self._embedder = Embedder(self)
        return self._embedder

    def chat(self, system: str | None = None, parse_special: bool = False):
        """A multi-turn ChatSession that keeps its KV cache across turns; parse_special:
        its messages' special-token text read as the tokens (default: as text)."""
        from .chat import ChatSession

        self.lifetime.check()
        if system is not None:
            arguments.text(system, "system")
        return ChatSession(self, system, arguments.flag(parse_special, "parse_special"))

    def save_session(self, path: str | os.PathLike, messages: Sequence[dict] | None = None):
        """Save the token ids and KV cache as they stand (and `messages`) to `path`
        (session.py: atomic, checksummed, bound to this model file, kv_type and context)."""
        from .cache.session import save_session

        if messages is not None and (isinstance(messages, (str, bytes)) or not isinstance(
                messages, Sequence) or not all(isinstance(m, Mapping) for m in messages)):
            raise arguments.ArgumentError("messages must be a list of dicts (chat messages)")
        with self.lifetime.exclusive():  # the cache must not move while it is written
            return save_session(self, path, None if messages is None else
                                {"messages": [dict(m) for m in messages]})

    def load_session(self, path: str | os.PathLike):
        """Restore a saved session (SessionError, and the model unchanged, if the file is
        bad or made with another model, kv_type or context); returns it (.tokens,
        .messages)."""
        from .cache.session import load_session

        with self.lifetime.exclusive():
            return load_session(self, path)

    def close(self) -> None:
        """Unmap the weights. A generation running in another thread ends first (its next
        step raises ClosedError); afterwards every method raises ClosedError."""
        self.lifetime.close(self._release)

    def _release(self) -> None:
        if self.speculation is not None and self.speculation.draft is not None:
            self.speculation.draft.close()
        self.prompt_cache = None
        self.model = None
        self.packed.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _chat_message(i: int, m: dict) -> dict:
    """Message i as templates take it: a str role (ArgumentError naming it otherwise, not a
    Jinja error from inside the template), and OpenAI's content parts, text only, joined
    into one string (templates concatenate content as a str)."""
    if not isinstance(m.get("role"), str):
        raise arguments.ArgumentError(f"messages[{i}] needs a str 'role', got "
                                      f"{m.get('role')!r:.40}")
    content = m.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise arguments.ArgumentError(f"messages[{i}].content: only text parts "
                                          "({'type': 'text', 'text': ...}) are supported")
        return {**m, "content": "".join(p["text"] for p in content)}
    return m


def _draft_argument(draft) -> str | None:
    """draft=: None, "lookup" or a draft model file's path (as a str)."""
    if draft is None or draft == "lookup":
        return draft
    if isinstance(draft, (str, os.PathLike)):
        return str(arguments.file_path(draft))
    raise arguments.ArgumentError(f"draft must be \"lookup\" or a model file's path, got "
                                  f"{type(draft).__name__}")


def load(path: str | os.PathLike, threads: int | None = None, context: int | None = None,
         precise: bool = False, kv_type: str = DEFAULT_KV_TYPE, prompt_cache_bytes: int = 0,
         fused: bool = True, lora=None, act_type: str = "int16", draft=None) -> LLM:
    """Open a packed model file. threads: Numba threads (default: all cores); context:
    KV cache length in tokens (default: the model's, at most 4096); precise: float
    activations for quantized weights (matches the float model; slower); kv_type: how
    the KV cache stores K and V ("f16", the default: the float model's answers in half
    f32's memory; "f32"; "q8_0", a quarter); prompt_cache_bytes: memory for snapshots of
    earlier sequences whose prefixes later prompts reuse (0: only the last sequence's cache
    is reused); fused: decode each token in one compiled parallel step where the model
    allows it (False: one kernel call per operation, the reference path; the CLI's default
    is EDGELLM_FUSED). A context beyond the model's
    max_position_embeddings warns (ContextWarning). lora: LoRA adapters applied at run
    time (a PEFT directory or adapter file, or a list of them or of (path, scale) pairs;
    LLM.set_lora switches them). act_type: the integer activations of quantized weights
    where not precise: "int16" (keeps the float model's greedy answers) or "int8"
    (llama.cpp's: faster batched decoding in `edgellm serve`; flips near-ties).
    draft: speculative decoding, several tokens a step with the same output: "lookup"
    (guesses from n-grams of the prompt and the output so far) or a smaller model file
    with the same tokenizer; a call's speculative=False turns it off."""
    return LLM(path, threads=threads, context=context, precise=precise, kv_type=kv_type,
               prompt_cache_bytes=prompt_cache_bytes, fused=fused, lora=lora,
               act_type=act_type, draft=draft)


__all__ = ["LLM", "load", "EdgeLLMError"]
