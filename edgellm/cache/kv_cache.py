"""Per-layer KV ring buffers: sliding-window layers hold the window, full layers the context.

Policy (as llama.cpp's context shift):
- Every cache slot remembers the position of the token it holds (-1 = empty); attention
  reads slots by position, so slot order does not matter.
- A sliding-window layer of window W keeps W slots and overwrites the oldest: a query at p
  only ever sees positions p-W+1..p, so nothing it needs is lost. With `spare` S it keeps
  W + S: a speculative verify step runs up to S + 1 positions at once and takes the
  rejected ones back (take_back), and the window of every position stays whole.
- A full-attention layer keeps `context` slots. When a chunk would not fit, `shift()`
  drops the oldest tokens after the first `n_keep` (the attention sinks: half of the rest,
  or more if the chunk needs it), moves every kept token that follows them `n_discard`
  positions back (its key is re-rotated by RoPE) and continues from there. The kept tokens
  keep their relative distances, so the model sees a contiguous, shorter history.

K and V are stored as `kv_type` (kv_types.py: f32, f16 or q8_0 rows [cap, Hkv, width]); the
attention kernels read f16 and q8_0 rows directly, dequantizing one row at a time, except a
prefill chunk's attention over an f16 cache: it decodes the layer's rows into float32
(F32Rows, one layer's worth shared by all; decode_f16, the CPU's conversion) and runs the
tiled kernel, 3-4x faster than reading the rows one at a time, for a tenth of that in
decoding.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from ..kernels.attention import attention, attention_rows
from ..kernels.kv_store import decode_f16, encode_f16, encode_q8_0
from ..kernels.rope import apply_rope, rope_tables
from ..modelfile import quant
from .kv_types import DEFAULT_KV_TYPE, KV_DTYPE, check_kv_type, kv_row_width
from .shared_rows import map_rows


def encode_rows(x: np.ndarray, kv_type: str) -> np.ndarray:
    """float32 [..., Dh] -> the stored rows [..., width] of kv_type (kernels/kv_store.py:
    numpy's float16 rounding, quant.py's q8_0, bit for bit)."""
    if kv_type == "f32":
        return x
    width = kv_row_width(kv_type, x.shape[-1])
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    out = np.empty((flat.shape[0], width), KV_DTYPE[kv_type])
    if kv_type == "f16":
        encode_f16(flat.view(np.uint32), out)
    else:
        encode_q8_0(flat, out)
    return out.reshape(*x.shape[:-1], width)


def decode_rows(stored: np.ndarray, kv_type: str, head_dim: int) -> np.ndarray:
    """Stored rows [..., width] -> float32 [..., Dh] (a new array)."""
    if kv_type == "f32":
        return np.array(stored, dtype=np.float32)
    if kv_type == "f16":
        return stored.view(np.float16).astype(np.float32)
    lead = stored.shape[:-1]
    flat = stored.reshape(-1, stored.shape[-1])
    return quant.dequantize(flat, "q8_0", (flat.shape[0], head_dim), 32).reshape(*lead, head_dim)


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros in a private anonymous mapping: pages cost memory only once written. (numpy
    asks for huge pages on large arrays, so writing one token's slot would commit 2 MB per
    layer; a shared mapping's first writes are slower still, and never get huge pages.)"""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n == 0:
        return np.zeros(shape, dtype)
    private = getattr(mmap, "MAP_PRIVATE", None)
    anon = getattr(mmap, "MAP_ANONYMOUS", None)
    m = mmap.mmap(-1, n) if private is None or anon is None else \
        mmap.mmap(-1, n, flags=private | anon)
    return np.frombuffer(m, dtype=dtype).reshape(shape)


class F32Rows:
    """Float32 K and V [cap, n_kv, head_dim] that a prefill chunk's attention decodes one
    layer's f16 rows into (the layers take turns); pages committed as rows are decoded."""

    def __init__(self, cap: int, n_kv: int, head_dim: int):
        self.k = lazy_zeros((cap, n_kv, head_dim), np.float32)
        self.v = lazy_zeros((cap, n_kv, head_dim), np.float32)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def decode(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """f16 rows k, v [n, n_kv, head_dim] (uint16 bits) -> float32 views [n, ...] here."""
        n, width = k.shape[0], k.shape[-1]
        for src, dst in ((k, self.k[:n]), (v, self.v[:n])):
            decode_f16(np.ascontiguousarray(src).reshape(-1, width), dst.reshape(-1, width))
        return self.k[:n], self.v[:n]


class LayerCache:
    """K/V [cap, n_kv, width] stored as kv_type, with slot positions; `window` 0 means full
    attention. f32_rows: an f16 cache's F32Rows for prefill chunks (None: read as stored)."""

    def __init__(self, k: np.ndarray, v: np.ndarray, pos: np.ndarray, window: int,
                 kv_type: str = "f32", head_dim: int | None = None,
                 f32_rows: F32Rows | None = None):
        self.k, self.v, self.pos = k, v, pos  # [cap, n_kv, width] x2, [cap]
        self.pos[:] = -1
        self.window = window
        self.kv_type = kv_type
        self.head_dim = k.shape[2] if head_dim is None else head_dim
        self.f32_rows = f32_rows
        self.written = 0  # tokens written since reset (next ring slot = written % cap)

    @property
    def cap(self) -> int:
        return self.pos.shape[0]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes

    def reset(self) -> None:
        self.pos[:] = -1
        self.written = 0

    def store(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> None:
        """Write a chunk's k/v [T, n_kv, head_dim] at `positions` [T]."""
        T = positions.shape[0]
        if not self.window and self.written + T > self.cap:
            raise RuntimeError("full-attention cache overflow: shift() first")
        start = max(0, T - self.cap)  # a ring keeps only the last cap rows of a long chunk
        slots = (self.written + np.arange(start, T)) % self.cap
        self.k[slots] = encode_rows(k[start:], self.kv_type)
        self.v[slots] = encode_rows(v[start:], self.kv_type)
        self.pos[slots] = positions[start:]
        self.written += T

    def attend(self, q, k, v, positions, scale: float, softcap: float, out) -> None:
        """out [T, Hq, Dh] = attention of q [T, Hq, Dh] over the slots written so far and the
        chunk's own k/v [T, Hkv, Dh] at `positions` [T] (kernels/attention.py)."""
        n = min(self.written, self.cap)  # slots written so far: the rest are empty
        if self.kv_type == "f32":
            attention(q, k, v, positions, self.k[:n], self.v[:n], self.pos[:n], self.window,
                      scale, softcap, out)
            return
        if self.f32_rows is not None and q.shape[0] > 1:  # a prefill chunk
            kf, vf = self.f32_rows.decode(self.k[:n], self.v[:n])
            attention(q, k, v, positions, kf, vf, self.pos[:n], self.window, scale, softcap,
                      out)
            return
        rows = (n * self.k.shape[1], self.k.shape[2])
        attention_rows(q, k, v, positions, self.k[:n].reshape(rows), self.v[:n].reshape(rows),
                       self.pos[:n], self.window, scale, softcap, out)


@dataclass
class CacheState:
    """A KVCache's contents: per layer the K, V [n, n_kv, width] and positions [n] of its
    n = min(written, cap) written slots and its write count; the next position and the
    count of tokens the full-attention layers hold."""

    k: list[np.ndarray]
    v: list[np.ndarray]
    pos: list[np.ndarray]
    written: list[int]
    next_pos: int
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.k, *self.v, *self.pos))


def truncatable(windows, caps, written, next_pos: int, n_tokens: int, n: int) -> bool:
    """Whether a cache (per layer: window, slots, tokens written) cut back to its first n
    tokens holds all that the query at position n, and every later one, needs.

    Not after a shift (positions no longer count tokens). A full-attention layer holds every
    position it was given. A sliding-window layer of window W holds the positions
    max(0, written - cap) .. written - 1 (slot p % cap), and the query at n needs
    n - W + 1 .. n - 1: with an overwritten start, n - W + 1 must not be older than it.
    """
    if next_pos != n_tokens or not 0 <= n <= n_tokens:
        return False
    for w, cap, wr in zip(windows, caps, written):
        oldest = max(0, int(wr) - int(cap))
        if w and oldest > 0 and n - int(w) + 1 < oldest:
            return False
    return True


class KVCache:
    """All layers' caches plus the next position; see the module docstring for the policy."""

    def __init__(self, layer_windows: list[int], context: int, n_kv: int, head_dim: int,
                 inv_freqs: list[np.ndarray], n_keep: int = 4, kv_type: str = DEFAULT_KV_TYPE,
                 spare: int = 0):
        self.kv_type = check_kv_type(kv_type, head_dim)
        dtype, width = KV_DTYPE[kv_type], kv_row_width(kv_type, head_dim)
        self.context = context
        self.n_keep = n_keep
        self.inv_freqs = inv_freqs
        caps = [min(w + spare, context) if w else context for w in layer_windows]
        self.caps = np.array(caps, dtype=np.int64)
        self.windows = np.array(layer_windows, dtype=np.int64)
        # One array of slots for all layers, layer i's at starts[i]..starts[i] + caps[i]
        # (sliding layers hold only their window): the fused decode step indexes it, a
        # session file stores it as it is.
        self.starts = np.concatenate([[0], np.cumsum(caps)[:-1]]).astype(np.int64)
        total = int(sum(caps))
        self.k_all = lazy_zeros((total, n_kv, width), dtype)
        self.v_all = lazy_zeros((total, n_kv, width), dtype)
        self.pos_all = np.full(total, -1, dtype=np.int64)
        # f16: the rows a prefill chunk's attention decodes (memory_plan.prefill_rows_bytes)
        self.f32_rows = F32Rows(max(caps), n_kv, head_dim) if kv_type == "f16" else None
        self.layers = [LayerCache(k, v, pos, w, kv_type, head_dim, self.f32_rows)
                       for (k, v, pos), w in zip(self._parts(self.k_all, self.v_all),
                                                 layer_windows)]
        self.next_pos = 0  # position of the next token
        self.n_tokens = 0  # tokens that full-attention layers hold

    def _parts(self, k_all: np.ndarray, v_all: np.ndarray) -> list[tuple]:
        """Each layer's (k, v, pos) slots of the all-layer arrays."""
        return [(k_all[s:s + c], v_all[s:s + c], self.pos_all[s:s + c])
                for s, c in zip(self.starts.tolist(), self.caps.tolist())]

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.next_pos = 0
        self.n_tokens = 0

    def can_truncate(self, n: int) -> bool:
        """Whether cutting back to the first n tokens leaves exactly what a continuation at
        position n needs (see `truncatable`)."""
        return truncatable(self.windows, self.caps, [layer.written for layer in self.layers],
                           self.next_pos, self.n_tokens, n)

    def truncate(self, n: int) -> bool:
        """Forget every token from position n on; False (nothing changed) if that cannot be
        done exactly: a shift happened, or a sliding window no longer holds what n needs."""
        if not self.can_truncate(n):
            return False
        for layer in self.layers:
            layer.pos[layer.pos >= n] = -1
            layer.written = min(layer.written, n)
        self.next_pos = self.n_tokens = n
        return True

    def take_back(self, n: int) -> None:
        """Forget the last n tokens written (a verify step's rejected positions), after a
        shift too. Exact where they were written since the last shift, and on a sliding
        layer as long as n <= spare + 1: the slots they overwrote held positions no later
        query sees (KVCache's `spare`); an emptied slot is masked as those were."""
        if not 0 <= n <= min(self.n_tokens, min(layer.written for layer in self.layers)):
            raise ValueError(f"cannot take back {n} of {self.n_tokens} tokens")
        for layer in self.layers:
            for i in range(1, n + 1):
                layer.pos[(layer.written - i) % layer.cap] = -1
            layer.written -= n
        self.next_pos -= n
        self.n_tokens -= n

    def state(self, copy: bool = True) -> CacheState:
        """What the cache holds: each layer's written slots (copies, or views)."""
        take = np.array if copy else np.asarray
        live = [min(layer.written, layer.cap) for layer in self.layers]
        return CacheState([take(layer.k[:n]) for layer, n in zip(self.layers, live)],
                          [take(layer.v[:n]) for layer, n in zip(self.layers, live)],
                          [take(layer.pos[:n]) for layer, n in zip(self.layers, live)],
                          [layer.written for layer in self.layers], self.next_pos,
                          self.n_tokens)

    def restore(self, st: CacheState) -> None:
        """Make the cache hold `st` (a state of a cache of the same shape), copying it in
        (rows kept in a RowFile are mapped, copy-on-write: shared_rows.py)."""
        for layer, k, v, pos, written in zip(self.layers, st.k, st.v, st.pos, st.written):
            n = pos.shape[0]
            if not map_rows(layer.k[:n], k):
                layer.k[:n] = k
            if not map_rows(layer.v[:n], v):
                layer.v[:n] = v
            layer.pos[:] = -1
            layer.pos[:n] = pos
            layer.written = written
        self.next_pos, self.n_tokens = st.next_pos, st.n_tokens

    def adopt(self, k_all, v_all, st: CacheState) -> None:
        """Use the arrays k_all, v_all [slots, n_kv, width] (every layer's slots in order, as
        the cache's own; e.g. read from a session file) in place of the cache's own,
        holding `st` (whose k/v are ignored)."""
        self.k_all, self.v_all = k_all, v_all
        for layer, (lk, lv, _), pos, written in zip(self.layers, self._parts(k_all, v_all),
                                                    st.pos, st.written):
            layer.k, layer.v = lk, lv
            layer.pos[:] = -1
            layer.pos[:pos.shape[0]] = pos
            layer.written = written
        self.next_pos, self.n_tokens = st.next_pos, st.n_tokens

    def move_to(self, k_all: np.ndarray, v_all: np.ndarray, pos_all: np.ndarray) -> None:
        """Keep the slots in k_all, v_all and pos_all from now on (arrays of the cache's
        own shapes and types: e.g. a slot's rows of the server's stacked caches), copying
        the written slots there."""
        for new, old in ((k_all, self.k_all), (v_all, self.v_all), (pos_all, self.pos_all)):
            if new.shape != old.shape or new.dtype != old.dtype:
                raise ValueError(f"cache arrays {new.dtype} {list(new.shape)} must be "
                                 f"{old.dtype} {list(old.shape)}")
        live = np.nonzero(self.pos_all >= 0)[0]
        k_all[live], v_all[live] = self.k_all[live], self.v_all[live]
        pos_all[:] = self.pos_all
        self.k_all, self.v_all, self.pos_all = k_all, v_all, pos_all
        for layer, (k, v, pos) in zip(self.layers, self._parts(k_all, v_all)):
            layer.k, layer.v, layer.pos = k, v, pos

    def room(self) -> int:
        """Tokens that fit before a shift is needed."""
        if all(layer.window for layer in self.layers):
            return 1 << 62
        return self.context - self.n_tokens

    def shift(self, need: int) -> int:
        """Make room for `need` tokens; returns how many positions everything moved back."""
        keep = min(self.n_keep, self.n_tokens)
        movable = self.n_tokens - keep
        discard = max(movable // 2, self.n_tokens + need - self.context)
        if discard > movable or need > self.context - keep:
            raise RuntimeError("chunk does not fit the context even after a shift")
        for layer, inv in zip(self.layers, self.inv_freqs):
            _shift_layer(layer, keep, discard, inv)
        self.n_tokens -= discard
        self.next_pos -= discard
        return discard


def _shift_layer(layer: LayerCache, keep: int, discard: int, inv_freq: np.ndarray) -> None:
    """Drop positions keep..keep+discard-1, move later ones back by `discard` (re-roped)."""
    pos = layer.pos
    drop = (pos >= keep) & (pos < keep + discard)
    pos[drop] = -1
    later = np.nonzero(pos >= keep + discard)[0]
    if later.size:
        cos, sin = rope_tables(np.full(later.size, -discard), inv_freq)
        k = decode_rows(layer.k[later], layer.kv_type, layer.head_dim)
        apply_rope(k, cos, sin)
        layer.k[later] = encode_rows(k, layer.kv_type)
        pos[later] -= discard
    if not layer.window:  # compact: full layers append at `written`
        live = np.nonzero(pos >= 0)[0]
        order = live[np.argsort(pos[live], kind="stable")]
        n = order.size
        layer.k[:n] = layer.k[order]
        layer.v[:n] = layer.v[order]
        layer.pos[:n] = pos[order]
        layer.pos[n:] = -1
        layer.written = n
