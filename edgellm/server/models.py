"""What one server serves, found by a request's `model`: chat models on engines, embedding
models and rerankers beside them, loaded on first use and closed least recently used first
when the next would pass the memory budget.

    served = Served(settings, max_memory=2 << 30, opener=open_file)
    served.add("smollm2", llm=llm)                 # loaded by the caller, who owns it
    served.add("qwen", path=Path("qwen.edgellm"))  # loaded here on first use
    async with served.lease("qwen"):               # loaded (waits, bounded), never closed
        engine = served.chat("qwen")               #   while a lease is held
    embedder, name = served.embedder("bert")     # reranker(name) likewise
    for name, kind, llm in served.loaded(): ...  # kind: "chat", "embedding", "rerank"

The lease is taken for a whole request, its stream included, by the Leases middleware
(router.py), so a route finds its model loaded and a model is never closed under a
request. A model's memory is its memory plan (edgellm.memory_plan: weights, KV cache,
buffers, tokenizer), and a chat model's prompt cache at its bound (--prompt-cache-bytes);
the runtime's own baseline is counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from ..cache.kv_types import DEFAULT_KV_TYPE
from ..errors import EdgeLLMError
from ..llm import LLM
from ..memory_plan import BASELINE
from .engine import Engine, Settings
from .errors import APIError

LOAD_WAIT_S = 120.0  # the most a request waits for memory held by models in use
# the runtime's baseline (memory_plan.BASELINE) and the server's own: its web framework
# and the compiled kernels of more than one architecture, which stay loaded
SERVER_BASELINE = BASELINE + 32 * 2**20


@dataclass
class Model:
    """A model the server can serve: its name, file, kind ("chat", "embedding", "rerank" or
    "audio") and the bytes it takes loaded; `llm` and `engine` while loaded."""

    name: str
    path: Path | None = None
    kind: str = "chat"
    planned: int = 0
    llm: LLM | None = None
    engine: Engine | None = None
    worker: ThreadPoolExecutor | None = None  # a side model's own thread
    owned: bool = True  # closed by the server (a model handed in by the caller is not)
    leases: int = 0
    used: float = field(default_factory=time.monotonic)
    loading: asyncio.Future | None = None


class Served:
    """The models of one server. `opener(path, kind) -> LLM` loads a model added by path;
    `max_memory` (bytes) bounds the loaded models' plans together (None: no bound)."""

    def __init__(self, settings: Settings, max_memory: int | None = None,
                 opener: Callable[[Path, str], LLM] | None = None,
                 warm: Callable[[Callable, LLM], None] | None = None,
                 context: int | None = None, kv_type: str = DEFAULT_KV_TYPE):
        """context: what `opener` loads models at (None: each model's default), for the
        plan of a model not loaded yet."""
        self.settings, self.max_memory, self.opener, self.warm = (settings, max_memory,
                                                                  opener, warm)
        self.context, self.kv_type = context, kv_type
        self.models: dict[str, Model] = {}
        self._on_engine: list[Callable[[Engine], None]] = []
        self.created = int(time.time())
        self._lock: asyncio.Lock | None = None  # made on the loop that serves
        self._released: asyncio.Event | None = None

    # what is served ---------------------------------------------------------------------
    def add(self, name: str, llm: LLM | None = None, path: Path | None = None,
            kind: str | None = None, engine: bool = True) -> Model:
        """A model served as `name`: `llm` (loaded, the caller's) or `path` (loaded here on
        first use). kind: "chat" or "embedding" (None: what the file is)."""
        if name in self.models:
            raise EdgeLLMError(f"two models are served as {name!r}: give each its own "
                               "name (--alias, or different file names)")
        if llm is not None:
            m = Model(name, Path(llm.packed.path), kind or _kind(llm), planned_bytes(llm),
                      llm=llm, owned=False)
            if m.kind == "chat" and engine:
                m.engine = self._made(Engine(llm, self.settings, name))
                m.planned += self._cache_bytes(m.kind)
            elif m.kind == "audio":  # its own thread: a transcription would stall the slots
                m.worker = _worker(name, llm)
        else:
            m = Model(name, Path(path), kind or "chat", 0)
        self.models[name] = m
        return m

    @property
    def routing(self) -> bool:
        """Whether any model is loaded and closed here (else all are the caller's, loaded
        for the server's whole life: no request needs a lease)."""
        return any(m.owned for m in self.models.values())

    def ids(self) -> list[str]:
        return list(self.models)

    def card(self, name: str) -> dict:
        """OpenAI's model object for `name` (404 when it is not served), with its `kind`
        (chat or embedding: the chat page lists the chat models) and whether it is loaded."""
        m = self._find(name)
        return {"id": name, "object": "model", "created": self.created, "owned_by": "edgellm",
                "kind": m.kind, "loaded": m.llm is not None}

    @property
    def engine(self) -> Engine:
        """The first chat model's engine (its Batch runs the legacy embedder's calls)."""
        return next(m.engine for m in self.models.values() if m.engine is not None)

    def on_engine(self, fn: Callable[[Engine], None]) -> None:
        """Call fn(engine) for each chat model's engine: those made already, and each one
        made when a model loads."""
        self._on_engine.append(fn)
        for e in self.engines():
            fn(e)

    def _made(self, engine: Engine) -> Engine:
        for fn in self._on_engine:
            fn(engine)
        return engine

    def engines(self) -> list[Engine]:
        return [m.engine for m in self.models.values() if m.engine is not None]

    def chat(self, name: str) -> Engine:
        """The engine answering chats and completions for model `name` (loaded: its request
        holds a lease)."""
        m = self._find(name, "chat")
        if m.engine is None:
            raise APIError(503, f"model {name!r} is not loaded", "server_error",
                           code="model_not_loaded", headers={"Retry-After": "1"})
        return m.engine

    def embedder(self, name: str) -> tuple[LLM, str]:
        """The embedding model `name` and the name it answers with."""
        return self._side(name, "embedding", "--embedding-model")

    def reranker(self, name: str) -> tuple[LLM, str]:
        """The cross-encoder `name` and the name it answers with."""
        return self._side(name, "rerank", "--rerank-model")

    def audio(self, name: str) -> tuple[LLM, str]:
        """The speech-to-text model `name` and the name it answers with."""
        return self._side(name, "audio", "--audio-model")

    def loaded(self) -> list[tuple[str, str, LLM]]:
        """(name, kind, model) of each model loaded."""
        return [(m.name, m.kind, m.llm) for m in self.models.values() if m.llm is not None]

    def _side(self, name: str, kind: str, option: str) -> tuple[LLM, str]:
        if not any(m.kind == kind for m in self.models.values()):
            raise APIError(404, f"no {kind} model is loaded (start the server with {option} "
                           "MODEL)", "not_found_error", "model", "model_not_found")
        m = self._find(name, kind)
        if m.llm is None:
            raise APIError(503, f"model {name!r} is not loaded", "server_error",
                           code="model_not_loaded", headers={"Retry-After": "1"})
        return m.llm, name

    async def call(self, name: str, fn, *args):
        """fn(*args) on model `name`'s thread: a chat model's engine, an embedding model's
        own worker (or, handed in by the caller, the first chat engine's, as before)."""
        m = self.models[name]
        if m.engine is not None:
            return await run_in_threadpool(m.engine.batch.call, fn, *args)
        if m.worker is not None:
            return await asyncio.wrap_future(m.worker.submit(fn, *args))
        return await run_in_threadpool(self.engine.batch.call, fn, *args)

    def _find(self, name: str, kind: str | None = None) -> Model:
        m = self.models.get(name)
        if m is None or (kind is not None and m.kind != kind):
            ids = [k for k, v in self.models.items() if kind is None or v.kind == kind]
            raise APIError(404, f"model {name!r} is not served here (serving: "
                           f"{', '.join(ids) or 'none'})", "not_found_error", "model",
                           "model_not_found")
        return m

    # loading and closing ----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, name: str):
        """Model `name` loaded and kept loaded until the block ends."""
        m = self.models[name]
        while m.llm is None:
            if m.loading is None:
                m.loading = asyncio.ensure_future(self._load(m))
            try:
                await asyncio.shield(m.loading)
            finally:
                if m.loading is not None and m.loading.done():
                    m.loading = None
        m.leases += 1
        m.used = time.monotonic()
        try:
            yield m
        finally:
            m.leases -= 1
            m.used = time.monotonic()
            self._events()[1].set()

    def _cache_bytes(self, kind: str) -> int:
        """The prompt cache a model of `kind` keeps loaded: a chat model's engine fills its
        slots' shared LRU up to --prompt-cache-bytes (and holds it)."""
        return self.settings.prompt_cache_bytes if kind == "chat" else 0

    def _in_use(self) -> int:
        return SERVER_BASELINE + sum(m.planned for m in self.models.values() if m.llm is not None)

    async def _load(self, m: Model) -> None:
        """Load `m`, first closing the least recently used idle models while the budget
        would be passed; waits (LOAD_WAIT_S at most) for models in use to go idle."""
        if self.opener is None:
            raise APIError(503, f"model {m.name!r} is not loaded", "server_error")
        if not m.planned:
            m.planned = await run_in_threadpool(planned_file_bytes, m.path, self.context,
                                               self.kv_type) + self._cache_bytes(m.kind)
        deadline = time.monotonic() + LOAD_WAIT_S
        lock, released = self._events()
        async with lock:  # one load at a time: each sees the memory the others took
            while self.max_memory is not None and self._in_use() + m.planned > self.max_memory:
                idle = [x for x in self.models.values()
                        if x.llm is not None and x.owned and x.leases == 0]
                if idle:
                    await self._close(min(idle, key=lambda x: x.used))
                    continue
                if not any(x.llm is not None and x.owned for x in self.models.values()):
                    raise APIError(503, f"model {m.name!r} needs {m.planned >> 20} MiB: "
                                   f"more than --max-memory leaves beside the models that "
                                   "stay loaded", "server_error", code="insufficient_memory")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise APIError(503, f"model {m.name!r} waits for memory held by models "
                                   "in use; try again", "server_error", code="model_busy",
                                   headers={"Retry-After": "5"})
                released.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(released.wait(), left)
            try:
                await run_in_threadpool(self._open, m)
            except EdgeLLMError as e:
                raise APIError(500, f"model {m.name!r} cannot be loaded: {e}",
                               "server_error", code="model_load_failed") from None

    def _open(self, m: Model) -> None:
        """Load `m` on this (worker) thread, with its engine or worker, warmed."""
        llm = self.opener(m.path, m.kind)
        try:
            m.kind = _kind(llm)
            m.planned = planned_bytes(llm) + self._cache_bytes(m.kind)
            if m.kind == "chat":
                m.engine = self._made(Engine(llm, self.settings, m.name))
                call = m.engine.batch.call
            else:
                m.worker = _worker(m.name, llm)
                call = lambda fn, *a: m.worker.submit(fn, *a).result()  # noqa: E731
            if self.warm is not None:
                self.warm(call, llm)
        except BaseException:
            if m.engine is not None:
                m.engine.close()
                m.engine = None
            llm.close()
            raise
        m.llm = llm

    async def _close(self, m: Model) -> None:
        engine, worker, llm = m.engine, m.worker, m.llm
        m.engine = m.worker = m.llm = None
        if engine is not None:
            engine.end()
            await run_in_threadpool(engine.close)
        if worker is not None:
            worker.shutdown(wait=True)
        await run_in_threadpool(llm.close)

    def _events(self) -> tuple[asyncio.Lock, asyncio.Event]:
        if self._lock is None:  # made on the loop that serves (not where the app was made)
            self._lock, self._released = asyncio.Lock(), asyncio.Event()
        return self._lock, self._released

    # the server's end -------------------------------------------------------------------
    def end(self) -> None:
        for e in self.engines():
            e.end()

    def close(self) -> None:
        """Close the engines, and the models the server loaded."""
        for m in self.models.values():
            if m.engine is not None:
                m.engine.close()
            if m.worker is not None:
                m.worker.shutdown(wait=False)
            if m.owned and m.llm is not None:
                m.llm.close()
                m.llm = m.engine = None


def _worker(name: str, llm: LLM) -> ThreadPoolExecutor:
    """A model's own thread, running parallel kernels on the model's threads (numba's count
    is per thread: a new thread's is every core's, and on a busy machine a transcription
    on the tiny test model took 10x longer so)."""
    from ..runtime.numba_setup import set_threads

    return ThreadPoolExecutor(1, thread_name_prefix=f"edgellm-{name}",
                              initializer=set_threads, initargs=(llm.threads,))


def _kind(llm: LLM) -> str:
    if isinstance(llm.packed.header.get("whisper"), dict):
        return "audio"
    if getattr(llm.model, "generates", True):
        return "chat"
    return "rerank" if llm.heads.kind == "reranker" else "embedding"


def planned_bytes(llm: LLM) -> int:
    """What `llm` takes loaded, beside the runtime's baseline: its memory plan (weights,
    KV cache, buffers, tokenizer), or its file's size for a model without a plan."""
    from ..memory_plan import plan

    try:
        args = llm.model.args
        kv = getattr(llm, "kv_type", DEFAULT_KV_TYPE)
        return plan(llm.packed, args, llm.context, kv).total - BASELINE
    except (AttributeError, TypeError, ValueError, EdgeLLMError):
        return llm.packed.file_size


def planned_file_bytes(path: Path, context: int | None = None,
                       kv_type: str = DEFAULT_KV_TYPE) -> int:
    """A model file's memory plan at `context` (None: its default), before it is loaded."""
    from ..memory_plan import default_context, plan
    from ..modelfile.format import PackedModel
    from ..validate import check_model

    try:
        with PackedModel(path) as packed:
            try:
                args = check_model(packed)
                ctx = min(context, args.max_position_embeddings) if context else \
                    default_context(args)
                return plan(packed, args, ctx, kv_type).total - BASELINE
            except (AttributeError, TypeError, ValueError, EdgeLLMError):
                return packed.file_size
    except OSError as e:
        raise APIError(500, f"{path}: cannot be read: {e}", "server_error") from None
