"""The HTTP app (FastAPI): the API surfaces over the served models (limits.py checks the
API key and the body size first).

    app = create_app(llm, Settings(model_id="smollm2", parallel=4), embedder=None)

Routes: GET /health, GET /v1/models, GET / (the chat page), and each API surface's
(openai_api.py: /v1/chat/completions, /v1/completions, /v1/embeddings; anthropic_api.py:
/v1/messages, /v1/messages/count_tokens; audio_api.py: /v1/audio/transcriptions and
/v1/audio/translations). A request is
checked and planned (its prompt rendered and tokenized, its constraint compiled) before
it waits for a slot, so a bad one is answered 400 at once (engine.py); then it runs on a
slot of the Batch (edgellm/batch.py), streaming as server-sent events when asked. A request
whose client leaves ends at its next prompt chunk or token. At shutdown (wind_down) the
generations in flight get a grace period, then end as if cut at max_tokens.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..llm import LLM
from . import anthropic_api, audio_api, metrics, openai_api, rerank_api, responses_api
from .engine import Settings
from .errors import APIError, from_validation, shaped
from .limits import BodyTooLarge, Limits
from .models import Served
from .router import Leases

__all__ = ["Settings", "create_app", "uvicorn_server"]


def create_app(llm: LLM | None, settings: Settings, embedder: LLM | None = None,
               reranker: LLM | None = None, served: Served | None = None,
               audio: LLM | None = None) -> FastAPI:
    """The app serving `llm` (and `embedder` at /v1/embeddings, `reranker` at /v1/rerank,
    a Whisper model `audio` at /v1/audio/...); it owns none: the caller closes them after
    the app has shut down (its lifespan closes the engines). Or the models of `served`
    (several, loaded on first use: commands/serve.py)."""
    if served is None:
        served = Served(settings)
        served.add(settings.model_id, llm=llm)
        if embedder is not None:
            served.add(settings.embedding_id, llm=embedder, kind="embedding")
        if reranker is not None:
            served.add(settings.rerank_id, llm=reranker, kind="rerank")
        if audio is not None:
            served.add(settings.audio_id, llm=audio, kind="audio")

    def wind_down(grace: float) -> None:
        """The server stops (on the event loop): requests in flight get `grace` seconds,
        then every generation ends after its token or prompt chunk in progress (a stream
        with a last chunk, finish_reason "length", and [DONE]) and the requests waiting
        for a slot are answered 503, so that the connections close before the server's
        own deadline (which would cancel them, a traceback each)."""
        asyncio.get_running_loop().call_later(max(grace, 0), served.end)

    @asynccontextmanager
    async def lifespan(app):
        yield
        served.close()

    app = FastAPI(title="edgellm", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    first = next(iter(served.engines()), None)  # the first chat model's (tests read it)
    app.state.batch = None if first is None else first.batch
    app.state.pool = None if first is None else first.pool
    app.state.wind_down, app.state.served = wind_down, served
    app.add_middleware(Leases, served=served)  # inside Limits: the body bounded first
    app.add_middleware(Limits, max_body=settings.max_body, api_key=settings.api_key,
                       larger=audio_api.body_bounds(settings))
    if settings.cors:
        from fastapi.middleware.cors import CORSMiddleware

        # any request header: OpenAI's JavaScript client sends its own (x-stainless-*)
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=["Retry-After"])

    # errors in the shape of the API the path belongs to (OpenAI's, or Anthropic's)
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(shaped(e, request.url.path), status_code=e.status,
                            headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        err = from_validation(list(e.errors()))
        return JSONResponse(shaped(err, request.url.path), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        if isinstance(e, BodyTooLarge):  # a body sent in chunks, found too large while read
            return JSONResponse(shaped(e.error, request.url.path), status_code=e.status_code)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        err = APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind)
        return JSONResponse(shaped(err, request.url.path), status_code=e.status_code,
                            headers=e.headers)  # a 405's Allow

    @app.get("/health")
    async def health():
        pools = [e.pool for e in served.engines()]
        return {"status": "ok", "slots": sum(len(p.slots) for p in pools),
                "slots_busy": sum(p.busy for p in pools),
                "queued": sum(len(p.waiting) for p in pools)}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [served.card(m) for m in served.ids()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        return served.card(name)

    @app.get("/", response_class=HTMLResponse)
    async def chat_page():
        return resources.files(__package__).joinpath("static/chat.html").read_text("utf-8")

    openai_api.add_routes(app, served)
    responses_api.add_routes(app, served)
    anthropic_api.add_routes(app, served)
    rerank_api.add_routes(app, served)
    audio_api.add_routes(app, served)
    metrics.add_routes(app, served)  # last: its middleware counts what the others answer
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
