"""One request's transcription: LLM.transcribe on the model's own thread (Served.call),
under a lease on the model, its info and segments handed to the event loop as they are
decoded, and stopped when the request's client leaves.

    run = Run(served, name, decode)   # starts at once; decode(llm, progress) -> (segments, info)
    item = await run.next(request)    # the TranscriptionInfo, each Segment, then None;
                                      # raises what the decoding raised; None as well once
                                      # `request`'s client has left (run.left)
    run.stop()                        # the client left: decoding ends at its next segment
                                      # or window (idempotent)

Where it stops: Whisper decodes 30 s windows and a window's segments come out together.
The run checks its stop flag after each segment it hands on, and the progress callback it
gives LLM.transcribe (called after every window, silent windows included) raises to end
the decoding there. So a client that leaves costs at most the window in progress, and the
model's thread (one per model: the next request waits for it) is free soon after.
A streamed response notices the client leaving itself (Starlette cancels its body, whose
`finally` calls stop()); a whole answer has next(request) poll for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from .engine import DISCONNECT_POLL_S
from .models import Served

_ITEM, _END, _ERROR = range(3)
_RUNNING: set[asyncio.Task] = set()  # the loop holds tasks weakly: a run outlives its request


class _Stopped(Exception):
    """Raised by the progress callback: the decoding's client has left."""


class Run:
    def __init__(self, served: Served, name: str, decode: Callable):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self._get: asyncio.Future | None = None
        self.left = False  # the client left before the end
        task = asyncio.ensure_future(self._run(served, name, decode))
        _RUNNING.add(task)
        task.add_done_callback(_RUNNING.discard)

    def stop(self) -> None:
        self._stop.set()

    async def next(self, request=None):
        """The next item, or None at the end or once `request`'s client has left."""
        if self.left:
            return None
        while True:
            if self._get is None:  # kept across polls: an item is never lost to a timeout
                self._get = asyncio.ensure_future(self._queue.get())
            try:
                await asyncio.wait({self._get}, timeout=None if request is None
                                   else DISCONNECT_POLL_S)
            except asyncio.CancelledError:
                self._get.cancel()
                self.stop()
                raise
            if self._get.done():
                kind, value = self._get.result()
                self._get = None
                if kind == _ITEM:
                    return value
                if kind == _ERROR:
                    raise value
                return None
            if await request.is_disconnected():
                self.left = True
                self._get.cancel()
                self.stop()
                return None

    async def _run(self, served: Served, name: str, decode: Callable) -> None:
        try:
            async with served.lease(name):  # held until the model's thread is done
                llm, _ = served.audio(name)
                await served.call(name, self._work, llm, decode)
            self._queue.put_nowait((_END, None))
        except asyncio.CancelledError:  # the server is shutting down
            self.stop()
            raise
        except Exception as e:  # noqa: BLE001 -- handed to the request, which answers it
            self._queue.put_nowait((_ERROR, e))

    def _work(self, llm, decode: Callable) -> None:
        """On the model's thread: decode, handing each item on, until the end or stop()."""
        def progress(done: float, total: float) -> None:  # after each window
            if self._stop.is_set():
                raise _Stopped

        if self._stop.is_set():  # gone while the model was busy with another request
            return
        try:
            segments, info = decode(llm, progress)
            try:
                self._hand(info)
                for segment in segments:
                    self._hand(segment)
                    if self._stop.is_set():
                        break
            finally:
                segments.close()  # frees the model for the next request
        except _Stopped:
            pass

    def _hand(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (_ITEM, item))
        except RuntimeError:  # the loop is gone (the server stopped): no one to hand it to
            self.stop()
