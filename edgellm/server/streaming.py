"""A blocking generation, iterated in its own thread, as an async iterator; and
server-sent events (sse).

The worker thread owns the generator: it pulls items and hands them to the event loop.
When the consumer stops (the client disconnected, or the server is shutting down), the
worker ends the generation after the item in progress (one token step) and closes it,
which frees the model's turn; `on_exit` (releasing the slot) then runs on the loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi.responses import StreamingResponse

from ..errors import EdgeLLMError
from .errors import APIError, from_edgellm

DONE = "data: [DONE]\n\n"


def event(data: Any, name: str | None = None) -> str:
    """One server-sent event carrying `data` as JSON, with an `event: name` line if named
    (the event streams of Anthropic's Messages and OpenAI's Responses name each event)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def in_thread(items: Iterator, on_exit: Callable[[], None],
                    stop: threading.Event | None = None) -> AsyncIterator:
    """`items` (a blocking iterator) pulled by a worker thread; see the module doc. `stop`
    is set when the consumer stops: an iterator that may go a long while without an item
    (a chat holding its tool calls' text back) checks it itself."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = stop or threading.Event()

    def hand(kind: str, value: Any = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone (the server stopped)
            pass

    def work() -> None:
        try:
            for item in items:
                hand("item", item)
                if stop.is_set():
                    break
            hand("end")
        except BaseException as e:  # noqa: B036 -- handed to the consumer, which re-raises
            hand("error", e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
            try:
                loop.call_soon_threadsafe(on_exit)
            except RuntimeError:  # the loop is gone: so are the slots it handed out
                pass

    threading.Thread(target=work, name="edgellm-request", daemon=True).start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == "item":
                yield value
            elif kind == "end":
                return
            else:
                raise value
    finally:
        stop.set()


def sse(events: AsyncIterator, fields: set[str], error_of=from_edgellm,
        done: str | None = DONE, named: bool = False,
        shape: Callable[[APIError], dict] = APIError.body) -> StreamingResponse:
    """`events` (dicts) as server-sent events, each named by its "type" if `named`, then
    `done`; an edgellm error after the first byte goes out as the last event,
    error_of(e, fields) as `shape` renders it."""
    def out(data: dict) -> str:
        return event(data, data.get("type") if named else None)

    async def body():
        try:
            async for e in events:
                yield out(e)
        except EdgeLLMError as e:
            yield out(shape(error_of(e, fields)))
        if done:
            yield done

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
