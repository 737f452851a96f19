"""Which slot serves a request, and the bounded queue of requests waiting for one.

A request goes to the free slot whose cache holds the longest prefix of its prompt (a
multi-turn chat finds its own conversation there and prefills only the new turn), else to
the free slot used least recently (so the other conversations stay cached). When every
slot is busy it waits, first come first served, in a queue of at most `queue` requests;
beyond that QueueFull (the server answers 503 with Retry-After); once closed (a shutdown),
PoolClosed for the waiting and later requests. All methods run on the
event loop's thread (a worker thread releases through loop.call_soon_threadsafe).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Sequence

from ..cache.prompt_cache import common_prefix


class QueueFull(Exception):
    """Every slot is busy and the queue is full."""


class PoolClosed(Exception):
    """The server is shutting down: no more slots are handed out."""


class SlotPool:
    """The batch's slots (edgellm.batch.SlotLLM), handed out one request at a time."""

    def __init__(self, slots: Sequence, queue: int):
        self.slots = list(slots)
        self.free = list(slots)
        self.queue = queue
        self.waiting: deque[tuple[asyncio.Future, list[int]]] = deque()
        self.closed = False
        self._clock = itertools.count()
        self.last_used = {id(s): next(self._clock) for s in slots}

    @property
    def busy(self) -> int:
        return len(self.slots) - len(self.free)

    def _pick(self, ids: Sequence[int]):
        def score(slot):
            return (common_prefix(slot.model.tokens, ids), -self.last_used[id(slot)])

        slot = max(self.free, key=score)
        self.free.remove(slot)
        self.last_used[id(slot)] = next(self._clock)
        slot.begin_generation()
        return slot

    async def acquire(self, ids: Sequence[int]):
        """A slot for a request whose prompt is `ids` (waits in the queue; QueueFull,
        PoolClosed)."""
        if self.closed:
            raise PoolClosed()
        if self.free and not self.waiting:
            return self._pick(ids)
        if len(self.waiting) >= self.queue:
            raise QueueFull(f"all {len(self.slots)} slots are busy and {len(self.waiting)} "
                            "requests are waiting")
        fut = asyncio.get_running_loop().create_future()
        entry = (fut, list(ids))
        self.waiting.append(entry)
        try:
            return await fut
        except asyncio.CancelledError:  # the client left while waiting
            if entry in self.waiting:
                self.waiting.remove(entry)
            elif fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())
            raise

    def close(self) -> None:
        """No more slots handed out: the waiting requests get PoolClosed."""
        self.closed = True
        while self.waiting:
            fut, _ = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(PoolClosed())

    def release(self, slot) -> None:
        """`slot`'s request is over: it serves the next in the queue, or waits free."""
        slot.end_generation()
        self.free.append(slot)
        while self.waiting and self.free and not self.closed:
            fut, ids = self.waiting.popleft()
            if not fut.done():
                fut.set_result(self._pick(ids))
