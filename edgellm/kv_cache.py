"""Per-layer KV ring buffers: sliding-window layers hold the window, full layers the context.

Policy (as llama.cpp's context shift):
- Every cache slot remembers the position of the token it holds (-1 = empty); attention
  reads slots by position, so slot order does not matter.
- A sliding-window layer of window W keeps W slots and overwrites the oldest: a query at p
  only ever sees positions p-W+1..p, so nothing it needs is lost.
- A full-attention layer keeps `context` slots. When a chunk would not fit, `shift()`
  drops the oldest tokens after the first `n_keep` (the attention sinks: half of the rest,
  or more if the chunk needs it), moves every kept token that follows them `n_discard`
  positions back (its key is re-rotated by RoPE) and continues from there. The kept tokens
  keep their relative distances, so the model sees a contiguous, shorter history.
"""

from __future__ import annotations

import mmap

import numpy as np

from .kernels.rope import apply_rope, rope_tables


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros in an anonymous mapping: pages cost memory only once written. (numpy asks for
    huge pages on large arrays, so writing one token's slot would commit 2 MB per layer.)"""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, n), dtype=dtype).reshape(shape)


class LayerCache:
    """K/V [cap, n_kv, head_dim] with slot positions; `window` 0 means full attention."""

    def __init__(self, k: np.ndarray, v: np.ndarray, pos: np.ndarray, window: int):
        self.k, self.v, self.pos = k, v, pos  # [cap, n_kv, head_dim] x2, [cap]
        self.pos[:] = -1
        self.window = window
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
        self.k[slots] = k[start:]
        self.v[slots] = v[start:]
        self.pos[slots] = positions[start:]
        self.written += T


class KVCache:
    """All layers' caches plus the next position; see the module docstring for the policy."""

    def __init__(self, layer_windows: list[int], context: int, n_kv: int, head_dim: int,
                 inv_freqs: list[np.ndarray], n_keep: int = 4):
        self.context = context
        self.n_keep = n_keep
        self.inv_freqs = inv_freqs
        caps = [min(w, context) if w else context for w in layer_windows]
        self.caps = np.array(caps, dtype=np.int64)
        self.windows = np.array(layer_windows, dtype=np.int64)
        # One array of slots for all layers, layer i's at starts[i]..starts[i] + caps[i]
        # (sliding layers hold only their window): the fused decode step indexes it.
        self.starts = np.concatenate([[0], np.cumsum(caps)[:-1]]).astype(np.int64)
        total = int(sum(caps))
        self.k_all = lazy_zeros((total, n_kv, head_dim), np.float32)
        self.v_all = lazy_zeros((total, n_kv, head_dim), np.float32)
        self.pos_all = np.full(total, -1, dtype=np.int64)
        parts = [(self.k_all[s:s + c], self.v_all[s:s + c], self.pos_all[s:s + c])
                 for s, c in zip(self.starts.tolist(), caps)]
        self.layers = [LayerCache(k, v, pos, w) for (k, v, pos), w in zip(parts, layer_windows)]
        self.next_pos = 0  # position of the next token
        self.n_tokens = 0  # tokens that full-attention layers hold

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.next_pos = 0
        self.n_tokens = 0

    def truncate(self, n: int) -> bool:
        """Forget every token from position n on; False if that cannot be done exactly
        (a shift happened, or a sliding window may have overwritten what n needs)."""
        if self.next_pos != self.n_tokens:
            return False  # shifted: positions no longer count tokens
        for layer in self.layers:
            if layer.window and self.next_pos - n > 0 and layer.written > layer.cap:
                return False
        for layer in self.layers:
            layer.pos[layer.pos >= n] = -1
            if not layer.window:
                layer.written = n
            else:
                layer.written = min(layer.written, n)
        self.next_pos = self.n_tokens = n
        return True

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
        k = np.ascontiguousarray(layer.k[later])
        apply_rope(k, cos, sin)
        layer.k[later] = k
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
