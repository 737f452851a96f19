"""The OpenAI-compatible HTTP app (FastAPI): its routes (limits.py checks the API key and
the body size first).

    app = create_app(llm, Settings(model_id="smollm2", parallel=4), embedder=None)

Routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
POST /v1/embeddings (when an embedding model is given), GET / (the chat page). A request
is checked and planned (its prompt rendered and tokenized, its constraint compiled) before
it waits for a slot, so a bad one is answered 400 at once (a prompt beyond the context or
max_prompt_tokens too: limits.fit_prompt); then it runs on a slot of the Batch
(edgellm/batch.py), streaming as server-sent events when asked. A request whose client
leaves ends at its next prompt chunk or token. At shutdown (wind_down) the generations in
flight get a grace period, then end as if cut at max_tokens (finish_reason "length").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import math
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..arguments import text as checked_text
from ..batch import Batch, Cancelled
from ..chat_completion import plan_chat_completion, run_plan
from ..errors import EdgeLLMError
from ..llm import LLM
from .errors import APIError, from_edgellm, from_validation
from .limits import BodyTooLarge, Limits, fit_prompt, refuse_early, token_bytes
from .schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Sampling
from .slots import PoolClosed, QueueFull, SlotPool
from .streaming import DONE, event, in_thread


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
    interleave: bool | None = None  # the batched step's interleaved weights (Batch's default)


def create_app(llm: LLM, settings: Settings, embedder: LLM | None = None) -> FastAPI:
    """The app serving `llm` (and `embedder` at /v1/embeddings); it owns neither: the
    caller closes them after the app has shut down (its lifespan closes the Batch)."""
    from contextlib import asynccontextmanager

    batch = Batch(llm, settings.parallel, settings.interleave)
    pool = SlotPool(batch.slots, settings.queue)
    created = int(time.time())
    prompt_limit = min(settings.max_prompt_tokens or llm.context, llm.context - 1)
    per_token = token_bytes(llm.tokenizer)
    ending = threading.Event()  # shutting down: the generations in flight end now

    def wind_down(grace: float) -> None:
        """The server stops (on the event loop): requests in flight get `grace` seconds,
        then every generation ends after its token or prompt chunk in progress (a stream
        with a last chunk, finish_reason "length", and [DONE]) and the requests waiting
        for a slot are answered 503, so that the connections close before the server's
        own deadline (which would cancel them, a traceback each)."""
        def cut():
            ending.set()
            pool.close()

        asyncio.get_running_loop().call_later(max(grace, 0), cut)

    @asynccontextmanager
    async def lifespan(app):
        yield
        batch.close()  # generations still running end at their next step

    app = FastAPI(title="edgellm", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.batch, app.state.pool, app.state.wind_down = batch, pool, wind_down
    app.add_middleware(Limits, max_body=settings.max_body, api_key=settings.api_key)
    if settings.cors:
        from fastapi.middleware.cors import CORSMiddleware

        # any request header: OpenAI's JavaScript client sends its own (x-stainless-*)
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=["Retry-After"])

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        err = from_validation(list(e.errors()))
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        if isinstance(e, BodyTooLarge):  # a body sent in chunks, found too large while read
            return JSONResponse(e.error.body(), status_code=e.status_code)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(e.status_code, f"{request.method} {request.url.path}: "
                                     f"{e.detail}", kind).body(), status_code=e.status_code,
                            headers=e.headers)  # a 405's Allow

    def models() -> list[str]:
        return [settings.model_id] + ([settings.embedding_id] if embedder is not None else [])

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": created, "owned_by": "edgellm"}

    def check_model(name: str, ids: list[str], what: str = "model") -> None:
        if name not in ids:
            raise APIError(404, f"model {name!r} is not served here (serving: "
                           f"{', '.join(ids) or 'none'})", "not_found_error", "model",
                           "model_not_found")

    def error_of(e: EdgeLLMError, fields: set[str]) -> APIError:
        if isinstance(e, Cancelled):  # its client gone (no one reads this), or a shutdown
            return APIError(503, "the server is shutting down" if ending.is_set() else
                            str(e), "server_error", code="unavailable",
                            headers={"Retry-After": "1"})
        return from_edgellm(e, fields)

    async def planned(fn, fields: set[str], *args, **kwargs):
        """fn(*args, **kwargs) in a worker thread, edgellm's errors as 400s."""
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except EdgeLLMError as e:
            raise error_of(e, fields) from None

    def watched(slot, stop: threading.Event) -> Callable[[], bool]:
        """The request's cancelled(): its client gone (`stop`) or the server ending; the
        slot's engine checks it before each prompt chunk (SlotLLM.watch)."""
        def cancelled() -> bool:
            return stop.is_set() or ending.is_set()

        slot.watch(cancelled)
        return cancelled

    async def answered(request: Request, slot, fn, fields: set[str], *args):
        """planned(fn, slot, *args, cancelled) for a whole answer: when the client leaves
        before it (a timeout), cancelled() turns true and fn ends its generation after the
        prompt chunk or token in progress, freeing the slot, instead of running to
        max_tokens for no one."""
        stop = threading.Event()
        if await request.is_disconnected():  # gone while it waited for the slot
            stop.set()
        task = asyncio.ensure_future(planned(fn, fields, slot, *args, watched(slot, stop)))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and not stop.is_set() and await request.is_disconnected():
                    stop.set()
        except asyncio.CancelledError:  # the handler cancelled (a shutdown): the generation
            stop.set()  # ends too, and the caller frees the slot only once it has
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)
            raise
        return task.result()

    async def prepared(fn, fields: set[str], *args, **kwargs):
        """planned(fn, ...) for a request's prompt, counted as arriving meanwhile (a round of
        prompts waits for it: Batch.arriving)."""
        with batch.arriving():
            return await planned(fn, fields, *args, **kwargs)

    def sampling_of(req: Sampling, fields: set[str]) -> dict:
        """The request's sampling fields (_sampling), checked as the sampler will check them:
        a bad value is a 400 before the request waits for a slot or starts a stream (a
        chat's are checked by plan_chat_completion)."""
        out = _sampling(req, llm.tokenizer.eos_ids)
        try:
            llm.sampler(**out)
        except EdgeLLMError as e:
            raise from_edgellm(e, fields) from None
        return out

    async def slot_for(ids):
        try:
            return await pool.acquire(ids)
        except QueueFull as e:
            raise APIError(503, str(e), "server_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except PoolClosed:
            raise APIError(503, "the server is shutting down", "server_error",
                           code="unavailable", headers={"Retry-After": "1"}) from None

    def fitted(ids: list[int], req: Sampling, what: str = "") -> list[int]:
        return fit_prompt(ids, llm.context, prompt_limit, req.truncate_prompt_tokens, what)

    def early(texts: list[str], req: Sampling, what: str = "") -> None:
        """A prompt whose `texts` alone cannot fit, refused before any work (unless it is
        to be truncated: that needs its tokens)."""
        if req.truncate_prompt_tokens is None:
            nbytes = sum(len(t.encode("utf-8", "replace")) for t in texts)
            refuse_early(nbytes, per_token, llm.context, prompt_limit, what)

    @app.get("/health")
    async def health():
        return {"status": "ok", "slots": len(pool.slots), "slots_busy": pool.busy,
                "queued": len(pool.waiting)}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(m) for m in models()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        check_model(name, models())
        return model_card(name)

    @app.get("/", response_class=HTMLResponse)
    async def chat_page():
        return resources.files(__package__).joinpath("static/chat.html").read_text("utf-8")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        check_model(req.model, [settings.model_id])
        fields = set(req.model_fields_set)
        if len(req.messages) > settings.max_messages:
            raise APIError(400, f"{len(req.messages)} messages: at most "
                           f"{settings.max_messages} are allowed", param="messages")
        max_tokens = _max_tokens(req.max_completion_tokens if req.max_completion_tokens
                                 is not None else req.max_tokens, settings)
        kwargs = dict(tools=req.tools, tool_choice=req.tool_choice,
                      response_format=req.response_format, max_tokens=max_tokens,
                      stop=req.stop, parallel_tool_calls=req.parallel_tool_calls is not False,
                      **_sampling(req, llm.tokenizer.eos_ids))  # checked by the planning
        early(_texts(req), req, " (the messages' text alone)")
        plan = await prepared(plan_chat_completion, fields, llm, _messages(req), **kwargs)
        plan = dataclasses.replace(plan, ids=fitted(plan.ids, req, " (the chat template and "
                                                                   "tools included)"))
        slot = await slot_for(plan.ids)
        if not req.stream:
            try:
                result = await answered(request, slot, _run_plan, fields, plan)
            finally:
                pool.release(slot)
            return {**result, "model": settings.model_id}
        usage = req.stream_options is not None and req.stream_options.include_usage
        stop = threading.Event()  # the client gone: ends even a stream holding tool calls
        chunks = in_thread(run_plan(slot, plan, True, watched(slot, stop)),
                           lambda: pool.release(slot), stop)
        return _sse(_chat_events(chunks, settings.model_id, usage), fields, error_of)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(req.model, [settings.model_id])
        fields = set(req.model_fields_set)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: one prompt per request (n=1)", param="prompt")
            prompt = prompt[0]
        if not prompt:  # "" or []
            raise APIError(400, "prompt is empty", param="prompt")
        kwargs = dict(max_tokens=_max_tokens(req.max_tokens, settings), stop=req.stop,
                      **sampling_of(req, fields))
        if isinstance(prompt, str):
            early([prompt], req)
        ids = fitted(await prepared(llm.encode_prompt, fields, prompt), req)
        slot = await slot_for(ids)
        base = {"id": "cmpl-" + uuid.uuid4().hex[:24], "object": "text_completion",
                "created": int(time.time()), "model": settings.model_id}
        if not req.stream:
            try:
                text, finish, n = await answered(request, slot, _complete, fields, ids, kwargs)
            finally:
                pool.release(slot)
            return {**base, "choices": [{"text": text, "index": 0, "logprobs": None,
                                         "finish_reason": finish}],
                    "usage": _usage(len(ids), n)}
        stop = threading.Event()
        cancelled = watched(slot, stop)
        try:
            stream = await planned(slot.stream_ids, fields, ids, **kwargs)
        except BaseException:
            pool.release(slot)
            raise
        usage = req.stream_options is not None and req.stream_options.include_usage
        chunks = in_thread(_until(stream, cancelled), lambda: pool.release(slot), stop)
        return _sse(_completion_events(chunks, base, len(ids), usage), fields, error_of)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest):
        if embedder is None:
            raise APIError(404, "no embedding model is loaded (start the server with "
                           "--embedding-model MODEL)", "not_found_error", "model",
                           "model_not_found")
        check_model(req.model, [settings.embedding_id])
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
            return batch.call(embedder.embed, texts), n

        vectors, n = await planned(embed, fields)
        data = [{"object": "embedding", "index": i,
                 "embedding": _encode_vector(v, req.encoding_format)}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": settings.embedding_id,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    return app


CUT_S = 0.5  # before the server's own shutdown deadline, the generations in flight end


def uvicorn_server(app: FastAPI, config):
    """A uvicorn.Server for `app` (create_app's, in `config`) whose shutdown first winds the
    app down (wind_down), CUT_S before uvicorn's timeout_graceful_shutdown would cancel
    the requests still running (a traceback each, and the time of the slowest)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.wind_down((self.config.timeout_graceful_shutdown or 0) - CUT_S)
            await super().shutdown(sockets)

    return Server(config)


# request -> edgellm arguments --------------------------------------------------------
DISCONNECT_POLL_S = 0.25  # how often a whole answer's request checks its client is there
_TOKEN_ID = re.compile(r"\s*-?[0-9]+\s*")  # a logit_bias key (int() also takes "1_0", "٣")


def _max_tokens(value: int | None, settings: Settings) -> int:
    if value is None:
        return min(256, settings.max_tokens)
    if value > settings.max_tokens:
        raise APIError(400, f"max_tokens is {value}: at most {settings.max_tokens} are "
                       "allowed", param="max_tokens")
    return value


def _sampling(req: Sampling, eos_ids) -> dict:
    """The request's sampling fields as LLM.stream_ids takes them; llama.cpp's ignore_eos
    bans the end-of-sequence ids (as llama-server does: a -inf bias), so a stream runs to
    max_tokens."""
    out: dict[str, Any] = {}
    for name, key in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                      ("min_p", "min_p"), ("repeat_penalty", "repetition_penalty"),
                      ("presence_penalty", "presence_penalty"),
                      ("frequency_penalty", "frequency_penalty"), ("seed", "seed")):
        value = getattr(req, name)
        if value is not None:
            out[key] = value
    if req.logit_bias:
        bias = {}
        for k, v in req.logit_bias.items():
            if _TOKEN_ID.fullmatch(k) is None:
                raise APIError(400, f"logit_bias: key {k!r} is not a token id",
                               param="logit_bias")
            bias[int(k)] = v
        out["logit_bias"] = bias
    if req.ignore_eos:
        out["logit_bias"] = {**out.get("logit_bias", {}), **dict.fromkeys(eos_ids, -math.inf)}
    return out


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


def _texts(req: ChatCompletionRequest) -> list[str]:
    """The text of the messages every template renders (system, user and tool contents,
    text parts included): the part of a prompt known before it is rendered."""
    out = []
    for m in req.messages:
        if m.role in ("system", "developer", "user", "tool"):
            parts = [m.content] if isinstance(m.content, str) else m.content or []
            out += [p if isinstance(p, str) else p.get("text") for p in parts]
    return [t for t in out if isinstance(t, str)]


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _run_plan(slot, plan, cancelled: Callable[[], bool]) -> dict:
    return run_plan(slot, plan, False, cancelled)


def _until(chunks, cancelled: Callable[[], bool]):
    """`chunks` (a completion's stream) until cancelled() after a chunk: then no more."""
    with contextlib.closing(chunks):
        for c in chunks:
            yield c
            if c.finish_reason is None and cancelled():
                return


def _complete(slot, ids: list[int], kwargs: dict,
              cancelled: Callable[[], bool]) -> tuple[str, str, int]:
    """(text, finish_reason, tokens generated) of a whole completion on `slot` (what there
    is when cancelled() turns true)."""
    parts, finish, n = [], "length", 0
    with slot.stream_ids(ids, **kwargs) as chunks:
        for c in chunks:
            parts.append(c.text)
            n += c.token is not None
            if c.finish_reason is not None:
                finish = c.finish_reason
            if cancelled():
                break
    return "".join(parts), finish, n


def _encode_vector(v: np.ndarray, fmt: str):
    if fmt == "base64":
        return base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


# streams -------------------------------------------------------------------------------
def _sse(events, fields: set[str], error_of=from_edgellm) -> StreamingResponse:
    async def body():
        try:
            async for e in events:
                yield event(e)
        except EdgeLLMError as e:  # after the first byte: the error as the last event
            yield event(error_of(e, fields).body())
        yield DONE

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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


async def _completion_events(chunks, base: dict, prompt_tokens: int, include_usage: bool):
    """A completion's chunks as OpenAI streams them; one cut before its end (_until: a
    shutdown) ends as cut at max_tokens, finish_reason "length"."""
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
        yield {**base, "choices": [], "usage": _usage(prompt_tokens, n)}
