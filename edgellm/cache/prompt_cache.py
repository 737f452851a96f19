"""Prefix reuse across calls: a prompt that starts like a sequence already computed
prefills only the rest.

The model's live cache holds its last sequence (prompt + generated ids). Before a call
prefills `ids`, `PromptCache.prepare` finds the longest prefix of `ids` that can be reused
exactly: from the live cache, or from a snapshot in an LRU of earlier sequences kept within
`budget` bytes (0: the live cache alone). A sequence can be reused up to its common prefix
with `ids`, as far as `kv_cache.truncatable` allows (sliding-window layers only hold their
last W positions; a shifted cache is never reused), and never to the last id: its logits
are what the call samples first. When the live sequence is about to be cut back or
replaced, a snapshot of it goes into the LRU first, so an app alternating between two
long system prompts finds both; where a model has sliding windows, whose rings the
generated ids overwrite, a snapshot is also taken as soon as the prompt is prefilled.

Several caches of one model (the server's slots) may share one LRU (`Snapshots`): a
sequence computed on one slot is then restored into another's cache. A snapshot holds the
cache's own stored rows (f32, f16 or q8_0, the sliding layers' rings as they are), so a
restore gives back exactly the KV the prefill wrote, whichever cache of the same model
takes it. On Linux the rows are kept in an in-memory file, and a restore maps its pages
into the cache copy-on-write instead of copying them (shared_rows.py): clients arriving
together with one long system prompt each start from it at once, and share its memory.
The shared LRU has a lock, which its lookups, restores and keeps hold: each slot restores
on its own request's thread (into its own cache, which nothing else touches between its
requests), not in a turn of the engine that runs the other slots' rounds.
A sequence that a kept one reproduces but for a few tokens (an eighth of it at most, and
at most one prefill chunk: NEW_SHARE) is not kept again: a client with the cached system
prompt and its own short question would otherwise write a copy of the whole prompt's rows
for its few new tokens, which a later prompt prefills again in less time than the copy
took, and evict sequences the cache holds nowhere else.
What follows is a prefill split where the reused prefix ends: with an f32 cache its logits
are mostly those of the whole prompt's prefill bit for bit (the prefill tiles' grouping of
the rows can change the rounding), with f16 or q8_0 within their rounding (a chunk attends
to its own K/V unrounded, to earlier chunks' as stored), as any chunk boundary does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .kv_cache import CacheState, truncatable
from .shared_rows import AVAILABLE, RowFile

NEW_SHARE = 8  # a sequence is kept if more than 1/NEW_SHARE of it is new to the LRU


@dataclass
class Snapshot:
    """A computed sequence: its ids and the cache state that holds them."""

    tokens: tuple[int, ...]
    state: CacheState

    def reusable(self, model, n: int) -> bool:
        c = model.cache
        return truncatable(c.windows, c.caps, self.state.written, self.state.next_pos,
                           self.state.n_tokens, n)


def kept_state(cache) -> CacheState:
    """A copy of what `cache` holds for the LRU: its K/V rows in a RowFile where the
    platform can map them (a restore then maps the rows, copy-on-write, instead of
    copying them: shared_rows.py)."""
    if not AVAILABLE:
        return cache.state(copy=True)
    st = cache.state(copy=False)
    rows = RowFile(st.k + st.v).arrays
    n = len(st.k)
    return CacheState(rows[:n], rows[n:], [p.copy() for p in st.pos], st.written,
                      st.next_pos, st.n_tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def longest_reusable(ok, common: int) -> int:
    """The largest n <= common with ok(n) (0 if none). `truncatable` only fails for a
    shorter cut where it fails for a longer one (a window that lost its start needs n
    large), so that is `common` or nothing; a shorter prefix comes from an older
    snapshot."""
    return common if common > 0 and ok(common) else 0


class Snapshots:
    """An LRU of snapshots (ids -> Snapshot) of at most `budget` bytes, oldest first."""

    def __init__(self, budget: int = 0):
        self.budget = max(0, int(budget))
        self.entries: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()
        self.lock = threading.RLock()  # (SharedPromptCache's: the slots' threads share it)

    @property
    def nbytes(self) -> int:
        return sum(s.state.nbytes for s in self.entries.values())


class PromptCache:
    """The live cache's sequence plus an LRU of snapshots (at most `budget` bytes; or
    `shared`, one several caches of the model use)."""

    def __init__(self, model, budget: int = 0, shared: Snapshots | None = None):
        self.model = model
        self.lru = Snapshots(budget) if shared is None else shared
        self.reused = 0  # ids the last prepare() took from a cache

    @property
    def budget(self) -> int:
        return self.lru.budget

    @property
    def entries(self) -> OrderedDict[tuple[int, ...], Snapshot]:
        return self.lru.entries

    @property
    def nbytes(self) -> int:
        return self.lru.nbytes

    def prepare(self, ids: Sequence[int]) -> list[int]:
        """Make the model's cache hold the longest reusable prefix of `ids`; returns the ids
        that still have to be prefilled (at least the last one)."""
        model, ids = self.model, list(ids)
        limit = len(ids) - 1
        live = longest_reusable(model.cache.can_truncate,
                                min(common_prefix(model.tokens, ids), limit))
        best, best_n = self.cached(ids, limit, live)
        if best is not None or live < len(model.tokens):
            self._remember()  # the live sequence is about to be cut back or replaced
        if best is not None:
            self.entries.move_to_end(best)
            snap = self.entries[best]
            model.cache.restore(snap.state)
            model.tokens[:] = snap.tokens
        model.truncate(best_n)  # resets for 0
        self.reused = best_n
        return ids[best_n:]

    def cached(self, ids: Sequence[int], limit: int, floor: int = 0):
        """(key, n): the snapshot in the LRU that gives the longest reusable prefix of `ids`,
        n <= limit tokens, longer than `floor`; (None, floor) if none does."""
        model, best, best_n = self.model, None, floor
        for key, snap in self.entries.items():
            common = min(common_prefix(snap.tokens, ids), limit)
            if common > best_n:
                n = longest_reusable(lambda k, s=snap: s.reusable(model, k), common)
                if n > best_n:
                    best, best_n = key, n
        return best, best_n

    def watch(self, chunks: Iterator) -> Iterator:
        """`chunks` of a generation, with a snapshot taken when the first arrives (the
        prompt is prefilled, no generated id run yet) where the model has sliding windows:
        the generation will overwrite what a later prompt sharing this one needs."""
        windowed = bool(self.budget) and any(self.model.cache.windows)
        for i, chunk in enumerate(chunks):
            if i == 0 and windowed:
                self.remember()
            yield chunk

    def remember(self) -> None:
        """Put a snapshot of the live sequence into the LRU (if it fits the budget)."""
        self._remember()

    def _remember(self) -> None:
        snap = self.snapshot()
        if snap is not None:
            self.keep(snap)

    def snapshot(self) -> Snapshot | None:
        """A snapshot of the live sequence for the LRU, or None (nothing worth keeping)."""
        return self._take() if self.worth_keeping() else None

    def _take(self) -> Snapshot:
        """The live sequence's tokens and stored rows, as a Snapshot."""
        return Snapshot(tuple(self.model.tokens), kept_state(self.model.cache))

    def worth_keeping(self) -> bool:
        """Whether a snapshot of the live sequence would go into the LRU: something to keep,
        that fits the budget, more than a few tokens (NEW_SHARE) beyond what the LRU gives."""
        model = self.model
        tokens = tuple(model.tokens)
        cache = model.cache
        if not tokens or cache.next_pos != cache.n_tokens or self.budget == 0 \
                or tokens in self.entries:
            return False
        if sum(min(layer.written, layer.cap) for layer in cache.layers) \
                * (cache.layers[0].nbytes / cache.layers[0].cap) > self.budget:
            return False  # (its bytes: it would not fit)
        new = len(tokens) - self.cached(tokens, len(tokens))[1]
        return new > min(len(tokens) // NEW_SHARE, model.chunk)

    def keep(self, snap: Snapshot | None) -> None:
        """Put `snap` (snapshot()) into the LRU if it fits the budget, older snapshots it
        reproduces out; a snapshot of a sequence kept already only counts as used."""
        if snap is None:
            return
        model, tokens = self.model, snap.tokens
        if tokens in self.entries:
            self.entries.move_to_end(tokens)
            return
        if snap.state.nbytes > self.budget:
            return
        for key in [k for k in self.entries if tokens[:len(k)] == k]:
            if snap.reusable(model, len(key)):  # the new snapshot reproduces it exactly
                del self.entries[key]
        self.entries[tokens] = snap
        while self.nbytes > self.budget:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()


class SharedPromptCache(PromptCache):
    """A PromptCache whose LRU others share, used from any thread: what reads or changes
    the LRU holds its lock; a restore runs on the caller's thread, into this cache alone."""

    def __init__(self, model, shared: Snapshots):
        super().__init__(model, shared=shared)

    def prepare(self, ids: Sequence[int]) -> list[int]:
        with self.lru.lock:
            return super().prepare(ids)

    def remember(self) -> None:
        with self.lru.lock:
            super().remember()

    def offer(self) -> None:
        """For a slot whose sequence has ended: its snapshot, if worth keeping, taken on the
        calling thread outside the lock (the copy beside the other slots' lookups and the
        engine's work), then kept."""
        with self.lru.lock:
            if not self.worth_keeping():
                return
        snap = self._take()
        with self.lru.lock:
            self.keep(snap)
