"""OpenAI's Chat Completions, Completions and Embeddings: requests translated for the
engine (engine.py), answers and streams in OpenAI's shape.

    add_routes(app, served)   POST /v1/chat/completions, /v1/completions, /v1/embeddings
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
from fastapi import FastAPI, Request

from ..arguments import text as checked_text
from ..errors import EdgeLLMError
from .engine import max_tokens_of, message_texts, sampling_fields
from .errors import APIError, from_edgellm
from .models import Served
from .schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from .streaming import sse


def add_routes(app: FastAPI, served: Served) -> None:
    settings = served.settings

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        engine = served.chat(req.model)
        fields = set(req.model_fields_set)
        if len(req.messages) > settings.max_messages:
            raise APIError(400, f"{len(req.messages)} messages: at most "
                           f"{settings.max_messages} are allowed", param="messages")
        max_tokens = max_tokens_of(req.max_completion_tokens if req.max_completion_tokens
                                   is not None else req.max_tokens, settings)
        messages = _messages(req)
        plan = await engine.plan_chat(
            messages, fields, message_texts(messages), req.truncate_prompt_tokens,
            tools=req.tools, tool_choice=req.tool_choice, response_format=req.response_format,
            max_tokens=max_tokens, stop=req.stop,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            **sampling_fields(req, engine.llm.tokenizer.eos_ids))  # checked by the planning
        if not req.stream:
            return {**await engine.answer(request, plan, fields), "model": engine.model_id}
        usage = req.stream_options is not None and req.stream_options.include_usage
        chunks = await engine.stream(plan)
        return sse(_chat_events(chunks, engine.model_id, usage), fields, engine.error_of)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        engine = served.chat(req.model)
        fields = set(req.model_fields_set)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: one prompt per request (n=1)", param="prompt")
            prompt = prompt[0]
        if not prompt:  # "" or []
            raise APIError(400, "prompt is empty", param="prompt")
        kwargs = dict(max_tokens=max_tokens_of(req.max_tokens, settings), stop=req.stop,
                      **engine.sampling(req, fields))
        if isinstance(prompt, str):
            engine.early([prompt], req.truncate_prompt_tokens)
        ids = engine.fitted(await engine.prepared(engine.llm.encode_prompt, fields, prompt),
                            req.truncate_prompt_tokens)
        slot = await engine.slot_for(ids)
        base = {"id": "cmpl-" + uuid.uuid4().hex[:24], "object": "text_completion",
                "created": int(time.time()), "model": engine.model_id}
        if not req.stream:
            text, finish, n, cached = await engine.answered(request, slot, _complete, fields,
                                                            ids, kwargs)
            return {**base, "choices": [{"text": text, "index": 0, "logprobs": None,
                                         "finish_reason": finish}],
                    "usage": usage_of(len(ids), n, cached)}
        stop = threading.Event()
        cancelled = engine.watched(slot, stop)
        try:
            stream = await engine.planned(slot.stream_ids, fields, ids, **kwargs)
        except BaseException:
            engine.pool.release(slot)
            raise
        usage = req.stream_options is not None and req.stream_options.include_usage
        seen: dict = {}
        chunks = engine.streamed(slot, _until(stream, cancelled, slot, ids, seen), stop)
        return sse(_completion_events(chunks, base, len(ids), usage, seen), fields,
                   engine.error_of)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest):
        embedder, name = served.embedder(req.model)
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        if not texts or len(texts) > settings.max_inputs:
            raise APIError(400, f"input: give 1..{settings.max_inputs} texts, got "
                           f"{len(texts)}", param="input")
        for i, t in enumerate(texts):  # a lone surrogate: refused before the tokenizer
            try:
                checked_text(t, "input" if isinstance(req.input, str) else f"input[{i}]")
            except EdgeLLMError as e:
                raise APIError(400, str(e), param="input") from None
        if req.dimensions is not None:
            raise APIError(400, "dimensions: the model's embeddings cannot be shortened",
                           param="dimensions")
        fields = set(req.model_fields_set) | {"input"}

        def embed():
            n = sum(len(ids) for ids in embedder.embedder.tokenize(texts))
            return embedder.embed(texts), n

        try:
            vectors, n = await served.call(name, embed)
        except EdgeLLMError as e:
            raise from_edgellm(e, fields) from None
        data = [{"object": "embedding", "index": i,
                 "embedding": _encode_vector(v, req.encoding_format)}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": name,
                "usage": {"prompt_tokens": n, "total_tokens": n}}


# request -> edgellm arguments --------------------------------------------------------
def _messages(req: ChatCompletionRequest) -> list[dict]:
    """The messages as plain dicts, OpenAI's "developer" role as the templates' "system"
    (content parts: joined, or refused by name, by LLM.apply_chat_template)."""
    out = []
    for m in req.messages:
        d = m.model_dump(exclude_none=True)
        if d["role"] == "developer":
            d["role"] = "system"
        out.append(d)
    return out


def usage_of(prompt: int, completion: int, cached: int = 0) -> dict:
    """OpenAI's usage; `cached`: the prompt's ids a prompt cache gave (not prefilled)."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _cached(slot, ids: list[int]) -> int:
    """The prompt ids the slot's prompt cache gave its current generation (known once its
    first chunk has come: the prompt is prefilled by then)."""
    return min(getattr(slot.prompt_cache, "reused", 0), len(ids))


def _until(chunks, cancelled: Callable[[], bool], slot, ids: list[int], seen: dict):
    """`chunks` (a completion's stream) until cancelled() after a chunk: then no more;
    seen["cached"]: the prompt ids the prompt cache gave, noted at the first chunk."""
    with contextlib.closing(chunks):
        for c in chunks:
            if "cached" not in seen:
                seen["cached"] = _cached(slot, ids)
            yield c
            if c.finish_reason is None and cancelled():
                return


def _complete(slot, ids: list[int], kwargs: dict,
              cancelled: Callable[[], bool]) -> tuple[str, str, int, int]:
    """(text, finish_reason, tokens generated, prompt ids the prompt cache gave) of a whole
    completion on `slot` (what there is when cancelled() turns true)."""
    parts, finish, n, cached = [], "length", 0, 0
    with slot.stream_ids(ids, **kwargs) as chunks:
        for c in chunks:
            if not parts:
                cached = _cached(slot, ids)
            parts.append(c.text)
            n += c.token is not None
            if c.finish_reason is not None:
                finish = c.finish_reason
            if cancelled():
                break
    return "".join(parts), finish, n, cached


def _encode_vector(v: np.ndarray, fmt: str):
    if fmt == "base64":
        return base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


# streams -------------------------------------------------------------------------------
async def _chat_events(chunks, model_id: str, include_usage: bool):
    """edgellm's chunk dicts as OpenAI streams them: usage only in a last chunk of its own
    (with stream_options.include_usage), null in the others."""
    async for c in chunks:
        usage = c.pop("usage", None)
        c["model"] = model_id
        if include_usage:
            c["usage"] = None
        yield c
        if usage is not None and include_usage:
            yield {**c, "choices": [], "usage": usage}


async def _completion_events(chunks, base: dict, prompt_tokens: int, include_usage: bool,
                             seen: dict):
    """A completion's chunks as OpenAI streams them; one cut before its end (_until: a
    shutdown) ends as cut at max_tokens, finish_reason "length"; the usage's cached
    tokens as _until saw them."""
    n, finish = 0, None

    def out(text: str, reason: str | None) -> dict:
        return {**base, "choices": [{"text": text, "index": 0, "logprobs": None,
                                     "finish_reason": reason}],
                **({"usage": None} if include_usage else {})}

    async for c in chunks:
        n += c.token is not None
        finish = c.finish_reason
        if c.text or c.finish_reason is not None:
            yield out(c.text, c.finish_reason)
    if finish is None:
        finish = "length"
        yield out("", finish)
    if include_usage:
        yield {**base, "choices": [], "usage": usage_of(prompt_tokens, n,
                                                        seen.get("cached", 0))}
