"""The batched decode step: the model's fused program (step/fused.py) run on one token of
each of up to R sequences per call, each with its own KV cache (step/batch_step.py).

    stepper = BatchDecoder.build(model, caches)   # None where the model has no fused step
    logits = stepper.step([0, 2], [tok0, tok2])    # caches 0 and 2, one token each: [2, V]

The caches (KVCache, the server's slots) move into stacked arrays k, v [R, slots, Hkv, Dh]
and pos [R, slots] (KVCache.move_to), which the kernel indexes by row; each row also has its
own copy of the fused step's arena and activation slots. A file whose matrices are in the
x16 layout (modelfile/layout.py, convert-model's default) is read in place, 16 rows a tile,
with no copy. For a rows-layout file, built with `interleave` (Batch: with 2 or more slots)
on AVX-512 VNNI, the step reads its q4_0, q4_1 and q8_0 matrices from interleaved copies
(kernels/interleave.py), made once here: several times faster than from the rows layout,
for the matrices' size in memory once more.
A row's logits are the step's for that sequence alone (one row), bit for bit, whatever
else the step carries;
several rows may run one sequence (a speculative verify step: `rows` > caches, a slot
repeated): a cache's rows are its next positions in row order, each the single step's
logits at its position, bit for bit (batch_step._attend_chain; the check_rows
conditions); against the single fused step (LLM.generate's) they are bit for bit
too where no q8_0 matrix is interleaved (the q4 tiles add as its 8x1 tile does), else
within rounding (a q8_0 block's 32 products summed in another order).
"""

from __future__ import annotations

import numpy as np

from ..cache.kv_cache import lazy_zeros
from ..kernels.interleave import ILV_BLOCK, ILV_ROWS, interleave
from ..kernels.linear import embedding
from ..kernels.sync import new_state
from ..modelfile import quant
from ..runtime.simd import VNNI
from . import batch_step as bs
from . import decode_step as ds
from .schedule import StepScheduler

# the types a rows-layout file's matrices are interleaved copies of, by code (q5_0 / q5_1:
# only in place, from an x16 file: in rows the single step's q5 tiles round otherwise)
_ILV = {quant.TYPES[n].code: n for n in ("q4_0", "q4_1", "q8_0")}


class BatchDecoder:
    """The fused step of `model` over up to len(caches) rows (see the module docstring)."""

    @classmethod
    def build(cls, model, caches: list, interleave: bool = True,
              rows: int | None = None) -> BatchDecoder | None:
        if getattr(model, "fused", None) is None:
            return None
        return cls(model, caches, interleave, rows)

    def __init__(self, model, caches: list, interleave: bool = True, rows: int | None = None):
        self.model = model
        # keep interleaved copies (on VNNI; _interleaved): True, or only of these type names
        self.interleave = interleave
        self.R = max(len(caches), rows or 0)  # rows a step carries at most
        C = len(caches)
        c0 = caches[0]
        self.k = lazy_zeros((C, *c0.k_all.shape), c0.k_all.dtype)
        self.v = lazy_zeros((C, *c0.v_all.shape), c0.v_all.dtype)
        self.pos = np.full((C, c0.pos_all.shape[0]), -1, np.int64)
        self.rows = [(self.k[i], self.v[i], self.pos[i]) for i in range(C)]
        # the kernel's view, as bytes like the fused step's: its _worker, not a second compile
        self.k_bytes, self.v_bytes = self.k.view(np.uint8), self.v.view(np.uint8)
        self.caches = list(caches)
        for cache, arrays in zip(self.caches, self.rows):
            cache.move_to(*arrays)
        self._tables(model.fused)

    def _tables(self, fused) -> None:
        """Per-row copies of the fused step's buffers and tables, and the interleaved
        weights (a rebuilt step, LoRA's, gets a new BatchDecoder: Batch._decode)."""
        R, f32 = self.R, np.float32
        self.fused = f = fused
        self.mem = np.zeros((R, f.mem.shape[0]), f32)
        self.xq = np.zeros((R, f.xq.shape[0]), f.xq.dtype)
        self.xd = np.zeros((R, f.xd.shape[0]), f32)
        self.xs = np.zeros((R, f.xs.shape[0]), np.int32)
        self.xds = np.zeros((R, f.xds.shape[0]), f32)
        self.kq, self.scores = np.zeros_like(f.kq), np.zeros_like(f.scores)
        self.state = new_state()  # the barrier's (kernels/sync.py)
        self.layers = np.repeat(f.layers[None], R, axis=0)
        self.cos = np.zeros((R, *f.inv_freq.shape), f32)
        self.sin = np.zeros((R, *f.inv_freq.shape), f32)
        self.ints = np.repeat(f.ints[None], R, axis=0)  # MoE: each row's routes
        p = f.model_tables
        self.tables = (p[0], p[1], p[2], p[3], self.ints, p[5], p[6])
        self.ilv = self._interleaved(p[1], p[5])
        self.positions = np.zeros(R, np.int64)
        self.slots = np.zeros(R, np.int64)
        D = self.model.args.hidden_size
        self.x = np.zeros((R, D), f32)
        self.x_at, self.logits_at = f.program.x_addr, f.program.logits_addr
        # a verify step's attention scratch (batch_step._attend_run): per worker, up to R
        # rows' rotated keys and query heads [R (Hq + 1), Dh], their scores and stats
        nt, Dh = f.kq.shape[0], f.kq.shape[2]
        Hq, slots = f.scores.shape[1] - 1, f.scores.shape[2]
        self.run_q = np.zeros((nt, R * (Hq + 1), Dh), f32)
        self.run_scores = np.zeros((nt, R * Hq + 1, max(slots, R * Hq)), f32)
        self.bufs = (self.mem, f.shared, f.private, self.xq, self.xd, self.xs, self.xds,
                     self.kq, self.scores, self.state, self.run_q, self.run_scores)
        # parallel or serial chosen per row count: a 4-row step takes ~1.7x a 1-row one,
        # which one chooser for all counts took for a slow parallel step (over 1.5x its
        # best) and probed, or ran, serially (11 of 96 4-row steps in one server run)
        # on the fused step's worker count, which sized the buffers copied above (its
        # `threads` may be None: numba's count when it was built, not now)
        self.schedulers = [StepScheduler(f.nt) for _ in range(R + 1)]

    def _interleaved(self, mats: np.ndarray, blob: np.ndarray) -> tuple:
        """Where the step reads its matrices in groups of 16 rows: (int64 [mats] byte offset
        of each in the bytes, or -1; uint8 bytes). A file whose matrices are in the x16
        layout (modelfile/layout.py) is read in place: the offsets are the file's, the
        bytes the mapped file, and no copy is made. Otherwise interleaved copies of its
        q4_0, q4_1 and q8_0 matrices (kernels/interleave.py), only on AVX-512 VNNI, where
        the q4 tiles are the 8x1 tile's results bit for bit (elsewhere the single step's
        tiles are other code), and not for the precise path (float activations), which
        never reads them."""
        at = np.full(mats.shape[0], -1, np.int64)
        x16 = mats[:, ds.MAT_LAYOUT] == ds.LAYOUT_X16
        if x16.any():  # its other matrices through their row groups
            at[x16] = mats[x16, ds.MAT_OFF]
            return at, blob
        if not VNNI or self.model.precise or not self.interleave:
            return at, np.zeros(0, np.uint8)
        kinds = set(_ILV.values()) if self.interleave is True else set(self.interleave)
        size = 0
        for k, m in enumerate(mats):
            if m[ds.MAT_KIND] in _ILV and _ILV[m[ds.MAT_KIND]] in kinds and \
                    m[ds.MAT_BLOCK] == 32 and m[ds.MAT_ROWS] % ILV_ROWS == 0:
                kind = _ILV[m[ds.MAT_KIND]]
                nb = m[ds.MAT_ROW_BYTES] // quant.TYPES[kind].block_bytes(32)
                at[k] = size
                size += m[ds.MAT_ROWS] // ILV_ROWS * nb * ILV_BLOCK[kind]
        # an anonymous mapping, not np.empty: numpy asks for huge pages for large arrays,
        # and where the kernel compacts memory for them on the fault (THP defrag
        # "madvise") the first write is many times slower
        data = lazy_zeros((size,), np.uint8)
        for k, m in enumerate(mats):
            if at[k] >= 0:
                rows, rb = m[ds.MAT_ROWS], m[ds.MAT_ROW_BYTES]
                w = blob[m[ds.MAT_OFF]:m[ds.MAT_OFF] + rows * rb].reshape(rows, rb)
                wi = interleave(w, _ILV[m[ds.MAT_KIND]])
                data[at[k]:at[k] + wi.size] = wi.ravel()
        return at, data

    @property
    def copy_bytes(self) -> int:
        """Bytes of the interleaved copies this step made (0: it reads the file in place)."""
        data = self.ilv[1]
        return 0 if data is self.fused.blob else data.nbytes

    @property
    def current(self) -> bool:
        """Whether this is still the model's step (set_lora rebuilds the model's)."""
        return self.model.fused is self.fused

    def step(self, slots: list[int], tokens: list[int]) -> np.ndarray:
        """Run tokens[r] at the next position of cache slots[r]; a slot named j times takes
        its next j positions, in row order (check_rows). Logits [n, vocab] (a new array)."""
        m, f = self.model, self.fused
        n = len(slots)
        if not 1 <= n <= self.R or len(tokens) != n or \
                not all(0 <= s < len(self.caches) for s in slots):
            raise ValueError(f"{n} rows for {self.R} rows of {len(self.caches)} caches: "
                             f"slots {slots}")
        ahead = dict.fromkeys(slots, 0)  # rows of each slot so far
        written = {}  # each slot's layers' slots written (read once: a verify step's rows
        for s in ahead:  # are one slot's, and a row's Python work adds to its cost)
            check_rows(self.caches[s], slots.count(s))
            written[s] = np.array([layer.written for layer in self.caches[s].layers], np.int64)
        for r, s in enumerate(slots):
            cache = self.caches[s]
            if cache.k_all is not self.rows[s][0] or cache.pos_all is not self.rows[s][2]:
                cache.move_to(*self.rows[s])  # it adopted other arrays (a session)
            j = ahead[s]
            ahead[s] += 1
            p = cache.next_pos + j
            self.positions[r], self.slots[r] = p, s
            ang = float(p) * f.inv_freq  # as FusedDecoder.step computes them
            self.cos[r] = (np.cos(ang) * f.rope_scale).astype(np.float32)
            self.sin[r] = (np.sin(ang) * f.rope_scale).astype(np.float32)
            w = written[s] + j
            caps = self.layers[r, :, ds.LAYER_CAP]  # the fused step's table: each layer's
            self.layers[r, :, ds.LAYER_SLOT] = w % caps
            self.layers[r, :, ds.LAYER_FILLED] = np.minimum(w, caps)
        D, V = m.args.hidden_size, m.args.vocab_size
        embedding(m.embed, np.array(tokens, np.int64), self.x[:n])
        self.mem[:n, self.x_at:self.x_at + D] = self.x[:n]
        kv = (self.k_bytes, self.v_bytes, self.pos, self.layers, self.cos, self.sin)
        self.schedulers[n].run(bs.batch_parallel, bs.batch_serial,
                               (self.tables, self.bufs, kv, self.positions, self.slots, n,
                                m.precise, bs.TILE, self.ilv, f.feats))
        for s, j in ahead.items():
            cache = self.caches[s]
            for layer in cache.layers:
                layer.written += j
            cache.next_pos += j
            cache.n_tokens += j
        for off, nbytes in f.program.routes:  # MoE: the experts each row read
            for r in range(n):
                for e in self.ints[r, off:off + m.top_k]:
                    m.expert_bytes_read += nbytes[e]
        return self.mem[:n, self.logits_at:self.logits_at + V].copy()


def check_rows(cache, n: int) -> None:
    """ValueError unless n rows of one step can run the next n positions of `cache` as n
    single steps would: every full-attention layer has room for them (no shift between
    them), and a sliding layer that overwrites slots on the way keeps cap - window >= n - 1
    spare slots (KVCache's `spare`): the slot row j overwrites then holds a position the
    rows before it would not have seen either (out of their window)."""
    for layer in cache.layers:
        if not layer.window:
            if layer.written + n > layer.cap:
                raise ValueError(f"{n} rows do not fit the cache ({layer.cap - layer.written}"
                                 " slots left): make room first")
        elif n > 1 and layer.written + n > layer.cap and layer.cap - layer.window < n - 1:
            raise ValueError(f"{n} rows of one sequence need {n - 1} spare slots beside the "
                             f"window of {layer.window} (KVCache spare)")
