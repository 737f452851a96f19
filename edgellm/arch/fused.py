"""The fused decode path of llama-family models: one compiled call per generated token.

`FusedDecoder.build(model)` returns None where the fused kernel does not apply (float or
mixed-float matrices, layers with different cache lengths, a threading layer that may run
two workers on one thread); the model then decodes through its per-operation path, which
computes the same function.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from .. import numba_setup
from ..kernels.decode_step import KIND_CODE, decode_parallel, decode_serial
from ..kernels.linear import embedding
from ..kernels.rope import rope_tables

MATS = ("q", "k", "v", "o", "gate", "up", "down")


def _entry(model, t, rows: int, cols: int) -> np.ndarray | None:
    """(offset, rows, row_bytes, kind, block) of a quantized matrix, checked against the
    shape the architecture needs; None if it is not a quantized matrix."""
    if t is None or t.type not in KIND_CODE or tuple(t.shape) != (rows, cols):
        return None
    info = model.packed.tensors[t.name]
    offset = model.packed.data_start + info.offset
    row_bytes = t.data.shape[1]
    if rows * row_bytes != info.nbytes or offset + info.nbytes > model.packed.file_size:
        return None
    return np.array([offset, rows, row_bytes, KIND_CODE[t.type], t.block_size], np.int64)


class FusedDecoder:
    """Tables and buffers for decode_parallel / decode_serial over one model."""

    @classmethod
    def build(cls, model) -> FusedDecoder | None:
        a = model.args
        if type(model).__name__ != "Llama" or not model.cache.uniform:
            return None
        if model.embed_scale != 1.0 or model.norm_offset != 0.0 or a.hidden_size % 32:
            return None
        D, Dh = a.hidden_size, a.head_dim
        qd, kvd = a.num_attention_heads * Dh, a.num_key_value_heads * Dh
        F = model.layers[0].gate.shape[0] if model.layers[0].gate is not None else 0
        if qd % 32 or F % 32 or F == 0:
            return None
        shapes = {"q": (qd, D), "k": (kvd, D), "v": (kvd, D), "o": (D, qd),
                  "gate": (F, D), "up": (F, D), "down": (D, F)}
        mats = np.zeros((len(model.layers), 7, 5), np.int64)
        for i, w in enumerate(model.layers):
            for j, name in enumerate(MATS):
                e = _entry(model, getattr(w, name), *shapes[name])
                if e is None:
                    return None
                mats[i, j] = e
        head = _entry(model, model.head, a.vocab_size, D)
        if head is None:
            return None
        return cls(model, mats, head)

    def __init__(self, model, mats: np.ndarray, head: np.ndarray):
        a = model.args
        L, D, Dh = len(model.layers), a.hidden_size, a.head_dim
        qd, kvd = a.num_attention_heads * Dh, a.num_key_value_heads * Dh
        F = int(mats[0, 4, 1])
        self.model, self.mats, self.head = model, mats, head
        self.blob = model.packed._mm
        f32 = np.float32
        self.norms = np.stack([np.stack([w.attn_norm, w.ffn_norm]) for w in model.layers]
                              ).astype(f32)
        self.final_norm = np.asarray(model.final_norm, f32)
        width = max(qd, kvd)
        self.biases = np.zeros((L, 3, width), f32)
        self.has_bias = any(w.q_bias is not None for w in model.layers)
        self.qk_norms = np.zeros((L, 2, Dh), f32)
        self.has_qk_norm = any(w.q_norm is not None for w in model.layers)
        for i, w in enumerate(model.layers):
            for j, b in enumerate((w.q_bias, w.k_bias, w.v_bias)):
                if b is not None:
                    self.biases[i, j, :b.shape[0]] = b
            for j, n in enumerate((w.q_norm, w.k_norm)):
                if n is not None:
                    self.qk_norms[i, j] = n
        self.Dh, self.eps = Dh, float(a.rms_norm_eps)
        self.inv_freq, self.rope_scale = model.rope[0]
        self.scale = float(model.attn_scale())
        nt = max(1, model_threads())
        self.nt = nt
        self.x = np.zeros((1, D), f32)
        self.q, self.k, self.v = (np.zeros((1, n), f32) for n in (qd, kvd, kvd))
        self.attn = np.zeros((1, qd), f32)
        self.gate, self.ffn = np.zeros((1, F), f32), np.zeros((1, F), f32)
        self.tmp = np.zeros((1, D), f32)
        self.logits = np.zeros((1, a.vocab_size), f32)
        self.h = np.zeros((nt, D), f32)
        self.acts = [_act(nt, n) for n in (D, qd, F)]
        group = a.num_attention_heads // a.num_key_value_heads
        self.kq = np.zeros((nt, 1 + group, Dh), f32)  # a worker's k head and q heads
        # a worker's softmax weights for one KV group's query heads, then a row of stats
        self.scores = np.zeros((nt, group + 1, max(int(model.cache.caps.max()), group)), f32)
        self.state = np.zeros(3, np.int64)  # barrier: arrived, generation, sleepers
        self.chooser = ThreadChoice()

    def step(self, token: int, precise: bool) -> np.ndarray:
        """Run one token at the cache's next position; logits [vocab] (an internal buffer)."""
        m, cache = self.model, self.model.cache
        p = cache.next_pos
        embedding(m.embed, np.array([token], np.int64), self.x)
        cos, sin = rope_tables(np.array([p], np.int64), self.inv_freq, self.rope_scale)
        slots = np.array([layer.written % layer.cap for layer in cache.layers], np.int64)
        nslots = np.array([min(layer.written, layer.cap) for layer in cache.layers], np.int64)
        args = (self.blob, self.mats, self.head, self.norms, self.final_norm, self.biases,
                self.has_bias, self.qk_norms, self.has_qk_norm, self.Dh, self.eps, 0.0,
                precise, cos[0], sin[0], cache.k, cache.v, cache.pos, cache.caps,
                cache.windows, slots, nslots, p, self.scale, self.x, self.q, self.k, self.v,
                self.attn, self.gate, self.ffn, self.tmp, self.logits, self.h, self.acts[0],
                self.acts[1], self.acts[2], self.kq, self.scores, self.state)
        if self.nt > 1 and numba.get_num_threads() == self.nt:
            parallel = self.chooser.parallel()
            t0 = time.perf_counter()
            if parallel:
                decode_parallel(self.nt, *args)
            else:
                decode_serial(*args)
            self.chooser.record(parallel, time.perf_counter() - t0)
        else:
            decode_serial(*args)
        for layer in cache.layers:
            layer.written += 1
        cache.next_pos += 1
        cache.n_tokens += 1
        return self.logits[0]


class ThreadChoice:
    """Parallel or serial decode step, from the wall time of recent steps.

    The workers of a parallel step meet at ~150 barriers per token: when other processes
    keep the cores busy, each barrier can wait for a descheduled partner, and the step
    becomes many times slower than one thread's. Parallel runs while its step time stays
    within SLOW x its best (which may drift up 0.5% per step, as the context grows); past
    that, or while serial runs, the other mode is timed once every PROBE steps (at once
    the first time; a probe's time replaces that mode's average), and the mode with the
    lower moving average runs. On a quiet machine nothing is ever probed.
    """

    SLOW, PROBE, ALPHA = 1.5, 32, 0.3

    def __init__(self):
        self.best = float("inf")  # best parallel step time (drifting)
        self.avg = {True: None, False: None}  # moving averages, parallel and serial
        self.mode = True
        self.since = 0  # steps since the other mode was timed

    def parallel(self) -> bool:
        """Run the next step in parallel?"""
        self.since += 1
        slow = self.avg[True] is not None and self.avg[True] > self.SLOW * self.best
        due = self.since >= self.PROBE or self.avg[not self.mode] is None
        if (slow or not self.mode) and due:
            self.since = 0
            return not self.mode
        return self.mode

    def record(self, parallel: bool, seconds: float) -> None:
        if parallel:
            self.best = min(self.best * 1.005, seconds)
        old = self.avg[parallel]
        probe = parallel != self.mode
        self.avg[parallel] = (seconds if old is None or probe
                              else old + self.ALPHA * (seconds - old))
        par, ser = self.avg[True], self.avg[False]
        self.mode = ser is None or par is None or par <= ser


def _act(nt: int, K: int) -> tuple:
    return (np.zeros((nt, K), np.int8), np.zeros((nt, K // 32), np.float32),
            np.zeros((nt, K // 32), np.int32), np.zeros((nt, K // 32), np.float32))


def model_threads() -> int:
    """Workers for the parallel step: numba's threads, where the layer runs them all at
    once (omp); otherwise 1 (the serial step)."""
    if numba_setup.THREADING_LAYER != "omp":
        return 1
    return numba.get_num_threads()
