"""One LLM's lifetime and its generation lock: who may touch the mapped weights and the
KV cache, and when they go away.

The rules (README "Threads and lifetimes"):
- An LLM runs one generation at a time. A generation holds a `Turn` from its start to its
  end: a whole `generate`/`logits` call, or a stream from its creation until it is
  exhausted, closed (`.close()`) or garbage-collected. Another thread asking for a turn
  waits for it; with `blocking=False` (or once `timeout` seconds pass) it gets BusyError.
- A thread that starts a generation while one of *its own* streams is still live ends
  that stream (its next step raises SupersededError): one thread cannot wait for itself,
  and two generations never interleave over one cache.
- `close()` ends the live turn (its next step raises ClosedError), waits for a kernel
  running in another thread to finish its step, then unmaps. Every step checks its turn
  under the step lock, so no kernel runs over unmapped memory and none over a cache that
  another generation has taken.

Adopting it in a method of LLM (one line each):

    def embed(self, texts, *, blocking=True, timeout=None):
        with self.lifetime.exclusive(blocking, timeout):   # ClosedError, BusyError
            ...                                            # weights and cache are ours

    def stream_something(self, ..., blocking=True, timeout=None):
        turn = self.lifetime.acquire(blocking, timeout)     # before touching the cache
        return self.lifetime.stream(turn, self._chunks(...))  # each step checked

`exclusive` holds the step lock for its whole block (close() waits for it); `stream`
holds it only while the generator computes its next item, so close() ends a stream
between two tokens.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from .errors import ArgumentError, BusyError, ClosedError, EdgeLLMError, SupersededError

T = TypeVar("T")


class Turn:
    """One generation's hold on the model. `ended` is the error its next step raises once
    close() or a newer generation of its thread took the model away."""

    __slots__ = ("thread", "owner", "previous_owner", "ended")

    def __init__(self, owner: Any, previous_owner: Any):
        self.thread = threading.get_ident()
        self.owner = owner
        self.previous_owner = previous_owner  # whose tokens the cache held at the start
        self.ended: EdgeLLMError | None = None

    def check(self) -> None:
        if self.ended is not None:
            raise type(self.ended)(str(self.ended))


def wait_arguments(blocking: Any, timeout: Any) -> float | None:
    """The seconds to wait at most (None: forever), checked."""
    if not isinstance(blocking, bool):
        raise ArgumentError(f"blocking must be True or False, got {blocking!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not timeout >= 0 or timeout == float("inf"):
            raise ArgumentError(f"timeout must be a finite number of seconds >= 0 or None, "
                                f"got {timeout!r}")
    if not blocking:
        return 0.0
    return None if timeout is None else float(timeout)


class Lifetime:
    """Open/closed state, the live turn and the step lock of one LLM (`name` goes into
    the errors' messages: the model file)."""

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._step = threading.RLock()  # held while a kernel runs over weights or cache
        self._turn: Turn | None = None
        self._closed = False
        self._last_owner: Callable[[], Any] | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def check(self) -> None:
        """Raise ClosedError if the LLM was closed."""
        if self._closed:
            raise ClosedError(f"{self.name}: the model is closed")

    def acquire(self, blocking: bool = True, timeout: float | None = None,
                owner: Any = None) -> Turn:
        """A turn for a new generation (see the module docstring); `owner` (e.g. a chat
        session) is remembered so the next turn's `previous_owner` says whose tokens the
        cache holds."""
        wait = wait_arguments(blocking, timeout)
        me = threading.get_ident()
        deadline = None if wait is None else time.monotonic() + wait
        superseded = False
        with self._cond:
            while True:
                self.check()
                live = self._turn
                if live is None:
                    break
                if live.thread == me:  # our own unfinished stream: end it
                    live.ended = SupersededError(
                        f"{self.name}: this stream was ended by a newer generation started "
                        "in its thread (an LLM runs one generation at a time)")
                    self._turn = None
                    superseded = True
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise BusyError(f"{self.name}: the model is busy with another "
                                    "generation")
                self._cond.wait(left)
            previous = self._last_owner() if self._last_owner is not None else None
            turn = Turn(owner, previous)
            self._turn = turn
            self._last_owner = _reference(owner)
        if superseded:  # the old stream may be mid-step in another thread: let it finish
            with self._step:
                pass
        return turn

    def release(self, turn: Turn) -> None:
        """End `turn` (no-op if it already ended); wakes a waiting caller."""
        with self._cond:
            if self._turn is turn:
                self._turn = None
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, blocking: bool = True, timeout: float | None = None,
                  owner: Any = None) -> Iterator[Turn]:
        """The model for the whole block (a one-shot call: logits, embed)."""
        turn = self.acquire(blocking, timeout, owner)
        try:
            with self._step:
                turn.check()
                yield turn
        finally:
            self.release(turn)

    def stream(self, turn: Turn, items: Iterator[T]) -> Stream[T]:
        """`items` as a Stream that holds `turn` until it ends."""
        return Stream(self, turn, items)

    def close(self, release: Callable[[], None]) -> None:
        """Mark closed, end the live turn, wait for a running step, then `release()` (unmap).
        Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            if self._turn is not None:
                self._turn.ended = ClosedError(f"{self.name}: the model was closed during "
                                               "this generation")
                self._turn = None
            self._cond.notify_all()
        with self._step:
            release()


def _reference(owner: Any) -> Callable[[], Any] | None:
    if owner is None:
        return None
    try:
        return weakref.ref(owner)
    except TypeError:
        return lambda: owner


class Stream(Generic[T]):
    """An iterator over a generation that holds the model's turn: each step runs under the
    step lock after checking the turn (ClosedError, SupersededError); the turn is released
    when the items end, on an error, on close() and when the stream is collected."""

    def __init__(self, lifetime: Lifetime, turn: Turn, items: Iterator[T]):
        self._lifetime = lifetime
        self._turn = turn
        self._items: Iterator[T] | None = items

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        if self._items is None:
            raise StopIteration
        try:
            with self._lifetime._step:
                self._turn.check()
                return next(self._items)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the generation here and free the model for the next one."""
        items, self._items = self._items, None
        if items is None:
            return
        try:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the generator's finally clauses run (no kernel: nothing to guard)
        finally:
            self._lifetime.release(self._turn)

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 -- at collection nothing can be reported
            pass
