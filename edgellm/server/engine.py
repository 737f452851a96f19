"""One chat model served on slots: a request's life from checked to answered, whatever API
shaped it.

    engine = Engine(llm, settings)
    plan = await engine.plan_chat(messages, fields, texts, truncate, **kwargs)
    result = await engine.answer(request, plan, fields)        # a whole answer, or
    chunks = await engine.stream(plan)                         # its chunks (async)

Each API surface (openai_api.py, and those beside it) translates its request into
chat_completion's arguments (messages in OpenAI's shape, tools, tool_choice,
response_format, sampling) and the chunks back into its own shape; the engine plans the
prompt before the request waits for a slot (a bad one is a 400 at once), fits it to the
context, hands out a slot, watches the client and the shutdown, and releases the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..batch import Batch, Cancelled
from ..chat_completion import plan_chat_completion, run_plan
from ..errors import EdgeLLMError
from ..llm import LLM
from .errors import APIError, from_edgellm
from .limits import fit_prompt, refuse_early, token_bytes
from .slots import PoolClosed, QueueFull, SlotPool
from .streaming import in_thread

DISCONNECT_POLL_S = 0.25  # how often a whole answer's request checks its client is there
# the shared prompt cache's default: ten 1,200-token sequences of SmolLM2-135M's f16 KV
# (22.5 KB a token), twenty at q8_0; memory taken only as sequences are kept
PROMPT_CACHE_BYTES = 256 << 20
_TOKEN_ID = re.compile(r"\s*-?[0-9]+\s*")  # a logit_bias key (int() also takes "1_0", "٣")


@dataclass
class Settings:
    model_id: str
    parallel: int = 1
    queue: int = 64  # requests waiting for a slot, beyond which 503
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_body: int = 1 << 20  # bytes of a request body (413 beyond)
    max_tokens: int = 4096  # the most a request may ask for
    max_prompt_tokens: int | None = None  # a prompt's tokens (None: the context less one)
    max_messages: int = 512
    max_inputs: int = 2048  # texts in one embeddings request
    embedding_id: str | None = None
    rerank_id: str | None = None
    audio_id: str | None = None  # the speech-to-text model's (/v1/audio/...)
    max_audio_bytes: int = 25 << 20  # an audio upload's (OpenAI's 25 MB; 413 beyond)
    interleave: bool | None = None  # the batched step's interleaved weights (Batch's default)
    # earlier sequences' KV that every slot of a chat model reuses prefixes from (0: none)
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES


class Engine:
    """`llm` on settings.parallel slots (a Batch) with a bounded queue; owns the Batch, not
    the LLM. Every method runs on the event loop except those handed to a worker thread."""

    def __init__(self, llm: LLM, settings: Settings, model_id: str | None = None):
        self.llm, self.settings = llm, settings
        self.model_id = model_id or settings.model_id
        self.batch = Batch(llm, settings.parallel, settings.interleave,
                           settings.prompt_cache_bytes)
        self.pool = SlotPool(self.batch.slots, settings.queue)
        self.prompt_limit = min(settings.max_prompt_tokens or llm.context, llm.context - 1)
        self.per_token = token_bytes(llm.tokenizer)
        self.ending = threading.Event()  # shutting down: the generations in flight end now

    # lifetime ----------------------------------------------------------------------------
    def end(self) -> None:
        """Every generation ends after its token or prompt chunk in progress; the requests
        waiting for a slot are answered 503."""
        self.ending.set()
        self.pool.close()

    def close(self) -> None:
        self.batch.close()  # generations still running end at their next step

    # checks before a request waits --------------------------------------------------------
    def error_of(self, e: EdgeLLMError, fields: set[str]) -> APIError:
        if isinstance(e, Cancelled):  # its client gone (no one reads this), or a shutdown
            return APIError(503, "the server is shutting down" if self.ending.is_set() else
                            str(e), "server_error", code="unavailable",
                            headers={"Retry-After": "1"})
        return from_edgellm(e, fields)

    async def planned(self, fn, fields: set[str], *args, **kwargs):
        """fn(*args, **kwargs) in a worker thread, edgellm's errors as 400s."""
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except EdgeLLMError as e:
            raise self.error_of(e, fields) from None

    async def prepared(self, fn, fields: set[str], *args, **kwargs):
        """planned(fn, ...) for a request's prompt, counted as arriving meanwhile (a round of
        prompts waits for it: Batch.arriving)."""
        with self.batch.arriving():
            return await self.planned(fn, fields, *args, **kwargs)

    def sampling(self, req, fields: set[str]) -> dict:
        """The request's sampling fields (sampling_fields), checked as the sampler will
        check them: a bad value is a 400 before the request waits for a slot."""
        out = sampling_fields(req, self.llm.tokenizer.eos_ids)
        try:
            self.llm.sampler(**out)
        except EdgeLLMError as e:
            raise from_edgellm(e, fields) from None
        return out

    def fitted(self, ids: list[int], truncate: int | None, what: str = "") -> list[int]:
        return fit_prompt(ids, self.llm.context, self.prompt_limit, truncate, what)

    def early(self, texts: list[str], truncate: int | None, what: str = "") -> None:
        """A prompt whose `texts` alone cannot fit, refused before any work (unless it is
        to be truncated: that needs its tokens)."""
        if truncate is None:
            nbytes = sum(len(t.encode("utf-8", "replace")) for t in texts)
            refuse_early(nbytes, self.per_token, self.llm.context, self.prompt_limit, what)

    async def plan_chat(self, messages: list[dict], fields: set[str], texts: list[str],
                        truncate: int | None = None, **kwargs):
        """A chat's plan (chat_completion.plan_chat_completion: its prompt rendered and
        tokenized, its constraint compiled), fitted to the context; `texts` are the
        messages' own text (refused by size before rendering)."""
        self.early(texts, truncate, " (the messages' text alone)")
        plan = await self.prepared(plan_chat_completion, fields, self.llm, messages, **kwargs)
        return dataclasses.replace(plan, ids=self.fitted(
            plan.ids, truncate, " (the chat template and tools included)"))

    # slots --------------------------------------------------------------------------------
    async def slot_for(self, ids):
        asked = time.monotonic()  # a time to first token counts the wait (metrics.py)
        try:
            slot = await self.pool.acquire(ids)
        except QueueFull as e:
            raise APIError(503, str(e), "server_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except PoolClosed:
            raise APIError(503, "the server is shutting down", "server_error",
                           code="unavailable", headers={"Retry-After": "1"}) from None
        slot.asked = asked
        return slot

    def watched(self, slot, stop: threading.Event) -> Callable[[], bool]:
        """The request's cancelled(): its client gone (`stop`) or the server ending; the
        slot's engine checks it before each prompt chunk (SlotLLM.watch)."""
        def cancelled() -> bool:
            return stop.is_set() or self.ending.is_set()

        slot.watch(cancelled)
        return cancelled

    async def answered(self, request, slot, fn, fields: set[str], *args):
        """fn(slot, *args, cancelled) in a worker thread for a whole answer: when the client
        leaves before it (a timeout), cancelled() turns true and fn ends its generation
        after the prompt chunk or token in progress, freeing the slot, instead of running
        to max_tokens for no one. The slot is released after."""
        stop = threading.Event()
        try:
            if await request.is_disconnected():  # gone while it waited for the slot
                stop.set()
            task = asyncio.ensure_future(self.planned(fn, fields, slot, *args,
                                                      self.watched(slot, stop)))
            try:
                while not task.done():
                    await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                    if (not task.done() and not stop.is_set()
                            and await request.is_disconnected()):
                        stop.set()
            except asyncio.CancelledError:  # the handler cancelled (a shutdown): the
                stop.set()  # generation ends too, and the slot is freed only once it has
                with contextlib.suppress(BaseException):
                    await asyncio.shield(task)
                raise
            return task.result()
        finally:
            self.pool.release(slot)

    def streamed(self, slot, items, stop: threading.Event) -> AsyncIterator:
        """`items` (a blocking iterator on `slot`) pulled in a worker thread; the slot is
        released when it ends or its consumer stops."""
        return in_thread(items, lambda: self.pool.release(slot), stop)

    # a chat, whole or streamed ----------------------------------------------------------
    async def answer(self, request, plan, fields: set[str]) -> dict:
        """The chat completion (OpenAI's dict, chat_completion's) of `plan`."""
        slot = await self.slot_for(plan.ids)
        return await self.answered(request, slot, _run_plan, fields, plan)

    async def stream(self, plan) -> AsyncIterator[dict]:
        """The chat completion chunks (OpenAI's dicts) of `plan`, the last with usage."""
        slot = await self.slot_for(plan.ids)
        stop = threading.Event()  # the client gone: ends even a stream holding tool calls
        return self.streamed(slot, run_plan(slot, plan, True, self.watched(slot, stop)), stop)


def max_tokens_of(value: int | None, settings: Settings, param: str = "max_tokens") -> int:
    """A request's token budget: 256 when unset, refused past --max-tokens."""
    if value is None:
        return min(256, settings.max_tokens)
    if value > settings.max_tokens:
        raise APIError(400, f"{param} is {value}: at most {settings.max_tokens} are "
                       "allowed", param=param)
    return value


SAMPLING_FIELDS = (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                   ("min_p", "min_p"), ("repeat_penalty", "repetition_penalty"),
                   ("presence_penalty", "presence_penalty"),
                   ("frequency_penalty", "frequency_penalty"), ("seed", "seed"))


def sampling_fields(req, eos_ids) -> dict:
    """The request's sampling fields (those of SAMPLING_FIELDS it has) as LLM.stream_ids
    takes them; llama.cpp's ignore_eos bans the end-of-sequence ids (as llama-server does:
    a -inf bias), so a stream runs to max_tokens."""
    out: dict[str, Any] = {}
    for name, key in SAMPLING_FIELDS:
        value = getattr(req, name, None)
        if value is not None:
            out[key] = value
    if getattr(req, "logit_bias", None):
        bias = {}
        for k, v in req.logit_bias.items():
            if _TOKEN_ID.fullmatch(k) is None:
                raise APIError(400, f"logit_bias: key {k!r} is not a token id",
                               param="logit_bias")
            bias[int(k)] = v
        out["logit_bias"] = bias
    if getattr(req, "ignore_eos", False):
        out["logit_bias"] = {**out.get("logit_bias", {}), **dict.fromkeys(eos_ids, -math.inf)}
    return out


def message_texts(messages: list[dict]) -> list[str]:
    """The text of the messages (OpenAI's chat shape) that every template renders (system,
    user and tool contents, text parts included): the part of a prompt known before it is
    rendered (Engine.plan_chat's `texts`)."""
    out = []
    for m in messages:
        if m.get("role") in ("system", "developer", "user", "tool"):
            content = m.get("content")
            parts = [content] if isinstance(content, str) else content or []
            out += [p if isinstance(p, str) else p.get("text") for p in parts
                    if isinstance(p, (str, dict))]
    return [t for t in out if isinstance(t, str)]


def _run_plan(slot, plan, cancelled: Callable[[], bool]) -> dict:
    return run_plan(slot, plan, False, cancelled)
