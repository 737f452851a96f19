"""The fused decode step: an architecture's steps compiled into one program per model.

`FusedDecoder.build(model)` compiles the model's per-layer steps (arch/steps.py, the same
lists its per-operation path runs), its embedding scale and its output head into a program
for step/decode_step.py, and returns None where the step does not apply (float or
mixed-float matrices, widths the int8 activations cannot split into blocks of 32); the
model then decodes through its per-operation path, which computes the same function.

The step is compiled for what the program uses (`features`: its matrix types, the cache's
kv_type, MoE, LoRA; decode_step.py): SmolLM2's compiles its q4_1 and q8_0 kernels and no
MoE, K-quant or f16/q8_0-cache code, about a third of the step with everything. A step for
another feature set compiles once too (the kernel cache keeps each). `FusedDecoder.prune =
False` compiles every op instead (one step for every model: the test suite's setting).

The compiler (`Program`) places every named buffer in one float32 arena: rows written by
split projections are shared, normed rows private to each worker. It inserts a barrier
where a step reads a whole vector that workers wrote in parts, or rewrites a vector other
workers may still read; a step reading a vector on the split that wrote it needs none.
"""

from __future__ import annotations

import numba
import numpy as np

from ..arch.steps import Act, Add, Attend, Experts, Linear, Norm
from ..cache.kv_types import kv_row_bytes
from ..kernels.jit import is_cached
from ..kernels.linear import embedding
from ..kernels.sync import new_state
from ..modelfile import layout as layouts
from . import decode_step as ds
from . import ops
from .schedule import StepScheduler

QUANTIZED = tuple(k for k in ds.KINDS if k != "f32")  # int8-activation matrix types
SB_TYPES = ("q4_k", "q5_k", "q6_k")  # read super-block activations (act_quant_k's ActK)
PAD = 16  # floats: regions start on 64-byte lines (workers write neighbouring rows)
SLOTS = ds.SLOTS


class Unsupported(Exception):
    """The model has something the fused step does not run (it keeps the per-op path)."""


def _pad(n: int) -> int:
    return (n + PAD - 1) // PAD * PAD


class Program:
    """The program rows, tables and arena layout of one model's decode step."""

    lora_split = True  # LORA_A's rows split between workers (lora_down)
    # the K-quant matrices (SB_TYPES) read activations quantized per 256 values
    # (kernels/act_quant_k.py), the others ActQ8's blocks of 32; False: all blocks of 32
    # but in the x16 layout's K-quant matrices
    superblock = True

    def __init__(self, model):
        a = model.args
        self.model = model
        self.ops: list[list[int]] = []
        self.mats: list[np.ndarray] = []
        self.mat_index: dict[tuple, int] = {}
        self.consts: list[float] = [float(a.rms_norm_eps), float(model.norm_offset)]
        self.params: list[np.ndarray] = []
        self.params_size = 0
        self.param_index: dict[int, int] = {}
        self.keep: list[np.ndarray] = []
        self.ints: list[np.ndarray] = [np.zeros(PAD, np.int64)]  # I_ZERO, I_KMAX, ...
        self.ints_size = PAD
        self.regions: dict[tuple, int] = {}  # (space, name, width) -> offset
        self.shared_size = 0
        self.private_size = 0
        self.loc: dict[str, tuple] = {}  # buffer name -> region key of its current value
        self.dirty: dict[tuple, int] = {}  # shared region -> split written since a barrier
        self.readers: dict[tuple, set] = {}  # shared region -> splits read (0: whole)
        # the (buffer, sb) each int8 slot holds: sb 1 super-blocks of 256, 0 blocks of 32
        self.slots: list[tuple | None] = [None] * SLOTS
        self.recent = 0  # the slot used last
        self.kmax = 32
        self.routes: list[tuple[int, list[int]]] = []  # MoE: (ints offset, expert bytes)
        self.barriers = 0
        self.lora: list[np.ndarray] = []  # LoRA matrices as float16 bits (lora_matrix)
        self.lora_size = 0
        self.pending: dict[str, list] = {}  # buffer -> LoRA up projections to add into it

    # tables ------------------------------------------------------------------------------
    def const(self, value: float) -> int:
        self.consts.append(float(value))
        return len(self.consts) - 1

    def param(self, vec: np.ndarray | None) -> int:
        if vec is None:
            return -1
        key = id(vec)
        if key not in self.param_index:
            self.keep.append(vec)  # alive while the program is built: ids stay unique
            v = np.ascontiguousarray(vec, np.float32).reshape(-1)
            self.param_index[key] = self.params_size
            self.params.append(v)
            pad = _pad(v.size) - v.size
            if pad:
                self.params.append(np.zeros(pad, np.float32))
            self.params_size += v.size + pad
        return self.param_index[key]

    def int_block(self, values: np.ndarray) -> int:
        off = self.ints_size
        v = np.asarray(values, np.int64).reshape(-1)
        self.ints.append(v)
        self.ints_size += v.size
        return off

    def matrix(self, t, rows: int | None = None, cols: int | None = None,
               float_ok: bool = False, fresh: bool = False) -> int:
        """Index of tensor t's entry in the matrix table (checked against the file)."""
        kind = t.type
        if kind not in QUANTIZED and not (float_ok and kind == "f32"):
            raise Unsupported(f"{t.name} is {kind}")
        key = (t.name,)
        if key in self.mat_index and not fresh:
            return self.mat_index[key]
        packed = self.model.packed
        info = packed.tensors[t.name]
        offset = packed.data_start + info.offset
        N, K = t.shape
        x16 = info.layout == layouts.X16  # [N / 16, 16 row bytes]: PROJ rows split by 16s
        row_bytes = t.data.shape[1] * t.data.itemsize // (layouts.GROUP_ROWS if x16 else 1)
        if (rows is not None and N != rows) or (cols is not None and K != cols):
            raise Unsupported(f"{t.name} has shape {list(t.shape)}")
        if N * row_bytes != info.nbytes or offset + info.nbytes > packed.file_size:
            raise Unsupported(f"{t.name}: table entry outside the file")
        if kind != "f32" and K % 32:
            raise Unsupported(f"{t.name}: {K} columns are not blocks of 32")
        if kind in SB_TYPES and K % 256:  # the super-block kernels' bound (act_quant_k)
            raise Unsupported(f"{t.name}: {K} columns are not super-blocks of 256")
        if kind == "f32" and offset % 4:
            raise Unsupported(f"{t.name}: unaligned f32 data")
        self.kmax = max(self.kmax, K)
        self.mats.append(np.array([offset, N, row_bytes, ds.KIND_CODE[kind], t.block_size,
                                   ds.LAYOUT_X16 if x16 else 0], np.int64))
        self.mat_index[key] = len(self.mats) - 1
        return len(self.mats) - 1

    # buffers and hazards ----------------------------------------------------------------
    def _region(self, space: str, name: str, width: int) -> tuple:
        key = (space, name, width)
        if key not in self.regions:
            if space == "s":
                self.regions[key] = self.shared_size
                self.shared_size += _pad(width)
            else:
                self.regions[key] = self.private_size
                self.private_size += _pad(width)
        return key

    def _addr(self, key: tuple) -> int:
        off = self.regions[key]
        return off if key[0] == "s" else -1 - off

    def barrier(self) -> None:
        self.ops.append([ops.BARRIER])
        self.barriers += 1
        self.synced()

    def synced(self) -> None:
        """Every worker has passed a barrier: what was written is visible to all."""
        self.dirty.clear()
        self.readers.clear()

    def read(self, name: str, split: int = 0) -> int:
        """Address of buffer `name`, read whole (split 0) or on the split of `split` rows."""
        if name in self.pending:
            self.flush_lora()
        if name not in self.loc:
            raise Unsupported(f"buffer {name!r} is read before it is written")
        key = self.loc[name]
        if key in self.dirty and (split == 0 or self.dirty[key] != split):
            self.barrier()
        if key[0] == "s":
            self.readers.setdefault(key, set()).add(split)
        return self._addr(key)

    def _clobber(self, name: str) -> None:
        self.slots = [None if s is not None and s[0] == name else s for s in self.slots]

    def write(self, name: str, width: int, split: int, private: bool = False) -> int:
        """Address for a new value of `name`: shared rows written on the split of `split`
        (-1: by heads), or each worker's private copy."""
        if name in self.pending:
            self.flush_lora()
        key = self._region("p" if private else "s", name, width)
        if not private:
            seen = self.readers.get(key, set())
            if any(r != split for r in seen) or self.dirty.get(key, split) != split:
                self.barrier()
            self.dirty[key] = split
        self.loc[name] = key
        self._clobber(name)
        return self._addr(key)

    def update(self, name: str, width: int) -> int:
        """Address of `name` for an in-place update of its rows (split `width`)."""
        addr = self.read(name, width)
        key = self.loc[name]
        if key[0] == "s":
            seen = self.readers.get(key, set())
            if any(r not in (width,) for r in seen) or self.dirty.get(key, width) != width:
                self.barrier()
            self.dirty[key] = width
            self.readers.setdefault(key, set()).add(width)
        self._clobber(name)
        return addr

    def quantized(self, name: str, K: int, sb: int = 0) -> int:
        """The int8 slot holding `name` in blocks of 32 (sb 0) or super-blocks of 256 (sb 1),
        quantized now if no slot does."""
        if (name, sb) in self.slots:
            slot = self.slots.index((name, sb))
        else:  # an empty slot, else the one used less recently
            slot = self.slots.index(None) if None in self.slots else 1 - self.recent
            self.emit(ops.QUANT, src=self.read(name), n=K, slot=slot, sb=sb)
            self.slots[slot] = (name, sb)
        self.recent = slot
        return slot

    def emit(self, code: int, **operands) -> None:
        names = ops.OPERANDS[code]
        assert set(operands) == set(names), (ops.OPS[code], set(operands) ^ set(names))
        self.ops.append([code] + [int(operands[n]) for n in names])

    # steps -------------------------------------------------------------------------------
    def step(self, s) -> None:
        m, a = self.model, self.model.args
        if isinstance(s, Norm):
            D = s.weight.shape[0]
            src = self.read(s.src)
            dst = self.write(s.dst, D, 0, private=True)
            self.emit(ops.NORM, src=src, dst=dst, n=D, weight=self.param(s.weight))
        elif isinstance(s, Linear):
            mat = self.matrix(s.w, float_ok=s.float_acts)
            N, K = s.w.shape
            outs = s.outputs
            widths = s.widths if len(outs) > 1 else (N,)
            if sum(widths) != N:
                raise Unsupported(f"{s.w.name}: outputs {widths} of {N} rows")
            if self.mats[mat][ds.MAT_LAYOUT] and any(w % layouts.GROUP_ROWS for w in widths):
                raise Unsupported(f"{s.w.name}: outputs {widths} split its x16 row groups")
            float_acts = s.float_acts or s.w.type == "f32"
            # x16 K-quant matrices have kernels on super-blocks only (x16_k.py)
            sb = int((self.superblock or self.mats[mat][ds.MAT_LAYOUT] != 0)
                     and not float_acts and s.w.type in SB_TYPES)
            slot = 0 if float_acts else self.quantized(s.src, K, sb)
            delta = m.lora.get(s.w.name)
            if delta is not None:
                t, b = self.lora_down(delta, s)
            row0 = 0
            for name, rows in zip(outs, widths):
                src = self.read(s.src)
                bias = -1 if s.bias is None else self.param(s.bias[row0:row0 + rows]
                                                            if len(outs) > 1 else s.bias)
                dst = self.write(name, rows, rows)
                self.emit(ops.PROJ, mat=mat, row0=row0, rows=rows, cols=K, src=src, slot=slot,
                          dst=dst, bias=bias, float_acts=float_acts, sb=sb)
                if delta is not None:  # dst rows += B[rows] . t, before dst is next read
                    self.pending.setdefault(name, []).append((t, b, delta.rank, row0, rows,
                                                              dst))
                row0 += rows
        elif isinstance(s, Attend):
            Hq, Dh = a.num_attention_heads, a.head_dim
            q, k, v = self.read(s.q), self.read(s.k), self.read(s.v)
            dst = self.write(s.dst, Hq * Dh, -1)
            perm = -1 if s.perm is None else self.int_block(s.perm)
            scale, cap = self.const(m.attn_scale()), self.const(m.attn_softcap)
            self.emit(ops.ATTEND, layer=s.layer, q=q, k=k, v=v, dst=dst,
                      q_norm=self.param(s.q_norm), k_norm=self.param(s.k_norm),
                      rope=m.rope_set[s.layer], perm=perm, scale=scale, softcap=cap)
            self.synced()  # ATTEND ends its heads with a barrier, then stores k, v
            for name in (s.k, s.v):
                self.readers.setdefault(self.loc[name], set()).add(0)
        elif isinstance(s, Act):
            F = self._width(s.gate)
            gate, up = self.read(s.gate, F), self.read(s.up, F)
            dst = self.write(s.dst, F, F)
            self.emit(ops.ACT, kind=ops.SILU if s.kind == "silu" else ops.GELU_TANH, gate=gate,
                      up=up, dst=dst, n=F)
        elif isinstance(s, Add):
            n = self._width(s.dst)
            src = self.read(s.src, n)
            dst = self.update(s.dst, n)
            scale = -1 if s.scale == 1.0 else self.const(s.scale)
            self.emit(ops.ADD, dst=dst, src=src, n=n, scale=scale)
        elif isinstance(s, Experts):
            self.experts(s)
        else:
            raise Unsupported(f"step {type(s).__name__}")

    def lora_matrix(self, m: np.ndarray) -> int:
        """Offset of float32 matrix m's float16 bits in the LoRA table."""
        self.lora.append(np.ascontiguousarray(m, np.float16).view(np.uint16).reshape(-1))
        self.lora_size += m.size
        return self.lora_size - m.size

    def lora_down(self, delta, s: Linear) -> tuple[str, int]:
        """t = A @ src for the LoRA Delta (lora/attach.py) of step s: each worker its own
        whole copy, or (lora_split) the rank's rows split between workers into a shared
        vector; returns (t's buffer name, B's offset in the LoRA table). Each projection
        has its own t, so that the up projections of a group (q, k, v) can wait for the
        group's first read (flush_lora): one barrier for the group."""
        R, (N, K) = delta.rank, s.w.shape
        assert delta.A.shape == (R, K) and delta.BT.shape == (R, N), s.w.name  # attach.check
        a, b = self.lora_matrix(delta.A), self.lora_matrix(delta.BT.T)
        name = f"lora_t {s.w.name}"
        x = self.read(s.src)
        t = self.write(name, R, -2, private=not self.lora_split)
        self.emit(ops.LORA_A, src=x, cols=K, a=a, rank=R, dst=t, split=int(self.lora_split))
        return name, b

    def flush_lora(self) -> None:
        """Emit every LoRA up projection waiting to add into its buffer (at the first read
        of one of them: one barrier for q, k and v's vectors t)."""
        pending, self.pending = self.pending, {}
        for name, ups in pending.items():
            for t, b, R, row0, rows, dst in ups:
                src = self.read(t)
                tmp = self.write("lora_y", rows, 0, private=True)
                self.emit(ops.LORA_B, t=src, b=b, rank=R, row0=row0, rows=rows, dst=dst,
                          tmp=tmp)
                key = self.loc[name]
                if key[0] == "s":  # rewritten on its rows' split (perhaps after a barrier)
                    self.dirty[key] = rows

    def _width(self, name: str) -> int:
        return self.loc[name][2]

    def experts(self, s: Experts) -> None:
        m, w = self.model, s.w
        E, k, D = m.n_experts, m.top_k, m.args.hidden_size
        router = self.matrix(w.router, E, D, float_ok=True)
        src = self.read(s.src)
        logits = self.write("router", E, E)
        self.emit(ops.PROJ, mat=router, row0=0, rows=E, cols=D, src=src, slot=0, dst=logits,
                  bias=-1, float_acts=1, sb=0)
        logits = self.read("router")
        idx = self.int_block(np.zeros(k * 64, np.int64))  # k per worker (<= 64 workers)
        weights = self.write("route_weights", k, 0, private=True)
        self.emit(ops.ROUTE, logits=logits, experts=E, top_k=k, renorm=int(m.renorm),
                  idx=idx, weights=weights)
        first = len(self.mats)
        F = w.experts[0][0].shape[0]
        for gate, up, down in w.experts:
            self.matrix(gate, F, D, fresh=True)
            self.matrix(up, F, D, fresh=True)
            self.matrix(down, D, F, fresh=True)
        slot = self.quantized(s.src, D)
        src = self.read(s.src)
        bufs = {n: self.write(n, width, width) for n, width in
                (("gate", F), ("up", F), ("ffn", F), ("y", D))}
        dst = self.update(s.dst, D)
        self.emit(ops.MOE, mat=first, top_k=k, src=src, slot=slot, gate=bufs["gate"],
                  up=bufs["up"], ffn=bufs["ffn"], y=bufs["y"], dst=dst, idx=idx,
                  weights=weights, inner=F, act=ops.SILU)
        self.slots[1 - slot] = None  # MOE quantizes ffn there
        self.synced()  # MOE ends with a barrier
        self.routes.append((idx, w.expert_nbytes))

    def head(self) -> None:
        m, a = self.model, self.model.args
        self.step(Norm("x", m.final_norm, "h"))
        self.step(Linear(m.head, "h", "logits"))
        V = a.vocab_size
        if m.logit_scale != 1.0:
            self.emit(ops.SCALE, buf=self.update("logits", V), n=V,
                      factor=self.const(m.logit_scale))
        if m.logit_softcap:
            self.emit(ops.SOFTCAP, buf=self.update("logits", V), n=V,
                      cap=self.const(m.logit_softcap))

    def compile(self) -> None:
        m, D = self.model, self.model.args.hidden_size
        self.write("x", D, D)
        self.synced()  # Python wrote the embedding row before the step
        if m.embed_scale != 1.0:
            self.emit(ops.SCALE, buf=self.update("x", D), n=D, factor=self.const(m.embed_scale))
        for steps in m.layer_steps:
            for s in steps:
                self.step(s)
        self.head()
        assert not self.pending, self.pending
        self.x_addr = self.regions[("s", "x", D)]
        self.logits_addr = self.regions[("s", "logits", m.args.vocab_size)]


_ON = np.zeros(1, np.int8)  # a feature the step compiles (any array; None: it does not)
ALL_FEATURES = (_ON,) * len(ds.FEATURES)


def features(prog: Program, kv_type: str) -> tuple:
    """decode_step's feats for this program on a cache of kv_type: what it runs, None for
    the rest (so that numba neither types nor compiles that)."""
    have = {ds.KIND_FEATURES[int(m[ds.MAT_KIND])] for m in prog.mats}  # by type code
    if any(m[ds.MAT_LAYOUT] for m in prog.mats):
        have.add("x16")
    codes = {row[0] for row in prog.ops}
    have.add("kv_" + kv_type)
    if codes & {ops.ROUTE, ops.MOE}:
        have.add("moe")
    if codes & {ops.LORA_A, ops.LORA_B}:
        have.add("lora")
    return tuple(_ON if name in have else None for name in ds.FEATURES)


def _cache_rows_fit(cache, head_dim: int) -> bool:
    """The cache's K and V are C-ordered [slots, Hkv, width] rows of its kv_type, as the
    step reads them (decode_step._attend tells the types apart by their row bytes)."""
    want = kv_row_bytes(cache.kv_type, head_dim)
    return all(x.flags.c_contiguous and x.ndim == 3 and x.shape[2] * x.itemsize == want
               for x in (cache.k_all, cache.v_all))


class FusedDecoder:
    """A compiled program with its tables and buffers, run once per decode token."""

    prune = True  # compile only the features the model's program uses (else all of them)

    @classmethod
    def build(cls, model, threads: int | None = None,
              act_dtype=np.int16) -> FusedDecoder | None:
        """The model's fused step, or None where it does not apply. act_dtype: the integer
        activations of the default (not precise) path, int16 (keeps the float model's
        answers: README, "Precision") or int8 (llama.cpp's, for comparison)."""
        a = model.args
        if a.hidden_size % 32 or not _cache_rows_fit(model.cache, a.head_dim):
            return None
        prog = Program(model)
        try:
            prog.compile()
        except Unsupported:
            return None
        return cls(model, prog, threads, act_dtype)

    def __init__(self, model, prog: Program, threads: int | None = None,
                 act_dtype=np.int16):
        a = model.args
        self.model, self.program, self.threads = model, prog, threads
        self.blob = model.packed._mm
        self.prog = np.array([row + [0] * (ops.WIDTH - len(row)) for row in prog.ops], np.int64)
        self.mats = np.stack(prog.mats)
        self.consts = np.array(prog.consts, np.float64)
        self.params = (np.concatenate(prog.params) if prog.params
                       else np.zeros(PAD, np.float32))
        self.ints = np.concatenate(prog.ints)
        self.ints[ds.I_ZERO], self.ints[ds.I_KMAX] = 0, prog.kmax
        self.scheduler = StepScheduler(threads)
        nt = self.nt = self.scheduler.threads
        f32 = np.float32
        self.shared, self.private = prog.shared_size, _pad(max(prog.private_size, 1))
        self.mem = np.zeros(self.shared + nt * self.private, f32)
        K = prog.kmax
        self.xq = np.zeros(nt * SLOTS * K, act_dtype)
        self.xd = np.zeros(nt * SLOTS * K // 32, f32)
        self.xs = np.zeros(nt * SLOTS * K // 16, np.int32)  # ActK's sums per 16 (ActQ8: per 32)
        self.xds = np.zeros(nt * SLOTS * K // 32, f32)
        Hq, Hkv = a.num_attention_heads, a.num_key_value_heads
        Dh = a.head_dim
        # a worker's k heads, q heads and a tile of decoded cache rows (f16 / q8_0 caches):
        # it attends all its heads in one pass over the cache (decode_step._attend_heads)
        self.kq = np.zeros((nt, Hkv + Hq + ds.LANES, Dh), f32)
        # a worker's softmax weights for its query heads, then a row of stats
        cache = model.cache
        self.scores = np.zeros((nt, Hq + 1, max(int(cache.caps.max()), Hq)), f32)
        self.state = new_state()  # the barrier's (kernels/sync.py)
        self.layers = np.zeros((len(cache.layers), ds.LAYER_WIDTH), np.int64)
        self.layers[:, ds.LAYER_START] = cache.starts
        self.layers[:, ds.LAYER_CAP] = cache.caps
        self.layers[:, ds.LAYER_WINDOW] = cache.windows
        inv = [model.rope_sets[i][0] for i in range(len(model.rope_sets))]
        self.inv_freq = np.stack(inv).astype(np.float64)  # [sets, Dh/2]
        self.rope_scale = np.array([s for _, s in model.rope_sets], np.float64)[:, None]
        D, V = a.hidden_size, a.vocab_size
        self.x = self.mem[prog.x_addr:prog.x_addr + D].reshape(1, D)
        self.logits = self.mem[prog.logits_addr:prog.logits_addr + V].reshape(1, V)
        self.lora = (np.concatenate(prog.lora) if prog.lora else np.zeros(PAD, np.uint16))
        self.feats = features(prog, model.cache.kv_type) if self.prune else ALL_FEATURES
        self.model_tables = (self.prog, self.mats, self.consts, self.params, self.ints,
                             self.blob, self.lora)
        self.bufs = (self.mem, self.shared, self.private, self.xq, self.xd, self.xs, self.xds,
                     self.kq, self.scores, self.state)
        # called once before the step first runs: the CLI waits there for the step's kernel
        # when another process compiles it (commands/first_run.py)
        self.ready = None

    @property
    def nbytes(self) -> int:
        """Bytes of the step's own arrays (the matrices stay in the mapped file)."""
        return sum(x.nbytes for x in (self.prog, self.mats, self.consts, self.params, self.ints,
                                      self.mem, self.xq, self.xd, self.xs, self.xds, self.kq,
                                      self.scores, self.state, self.layers, self.inv_freq,
                                      self.lora))

    def load(self) -> None:
        """Load (or compile) the step's kernel without running it, as the scheduler will
        call it: parallel on nt > 1 workers, else serial. Not the embedding lookup the step
        starts with: that is the prefill's kernel, which the model's warmup loads (on a
        first run this process may be the one compiling the step while another compiles
        the prefill: commands/first_run.py)."""
        _Forced(self.nt > 1, self.nt, run=False).run(ds.decode_parallel, ds.decode_serial,
                                                     self._args(False))

    def warm_variants(self) -> None:
        """Run one token through each form of the step, parallel and serial (compiling or
        loading both): which one runs is chosen per token by the scheduler and by the
        thread count, neither of which is part of the kernels' signatures. Leaves a token
        in the cache: the caller resets it."""
        scheduler = self.scheduler
        try:
            for parallel in (True, False):
                self.scheduler = _Forced(parallel, self.nt)
                self.step(0, False)
        finally:
            self.scheduler = scheduler

    def cached(self) -> bool:
        """Whether the form load() calls is compiled or in the kernel cache already (so that
        loading it compiles nothing)."""
        args = self._args(False)
        if self.nt > 1:
            return is_cached(ds.decode_parallel, (self.nt, *args))
        return is_cached(ds.decode_serial, args)

    def step(self, token: int, precise: bool) -> np.ndarray:
        """Run one token at the cache's next position; logits [vocab] (an internal buffer)."""
        if self.ready is not None:  # once, before the kernel is first needed
            ready, self.ready = self.ready, None
            ready()
        m, cache = self.model, self.model.cache
        embedding(m.embed, np.array([token], np.int64), self.x)
        self.scheduler.run(ds.decode_parallel, ds.decode_serial, self._args(precise))
        for layer in cache.layers:
            layer.written += 1
        cache.next_pos += 1
        cache.n_tokens += 1
        for off, nbytes in self.program.routes:  # MoE: the experts this token read
            for e in self.ints[off:off + m.top_k]:
                m.expert_bytes_read += nbytes[e]
        return self.logits[0]

    def _args(self, precise: bool) -> tuple:
        """The step kernel's arguments (after nt) for the cache's next position: the tables,
        the buffers, the cache with its layer table and this position's RoPE rows."""
        cache = self.model.cache
        p = cache.next_pos
        ang = float(p) * self.inv_freq
        cos = (np.cos(ang) * self.rope_scale).astype(np.float32)
        sin = (np.sin(ang) * self.rope_scale).astype(np.float32)
        layers = self.layers
        for i, layer in enumerate(cache.layers):
            layers[i, ds.LAYER_SLOT] = layer.written % layer.cap
            layers[i, ds.LAYER_FILLED] = min(layer.written, layer.cap)
        # the cache's bytes: one compiled step for every kv_type (decode_step._attend)
        kv = (cache.k_all.view(np.uint8), cache.v_all.view(np.uint8), cache.pos_all, layers,
              cos, sin)
        return (self.model_tables, self.bufs, kv, p, precise, self.feats)


class _Forced:
    """A StepScheduler stand-in that always runs the parallel (on nt workers) or the serial
    form of the step; with run=False it only loads (or compiles) that kernel for the
    arguments' types."""

    def __init__(self, parallel: bool, nt: int, run: bool = True):
        self.parallel, self.nt, self.execute = parallel, nt, run

    def run(self, parallel_fn, serial_fn, args: tuple) -> None:
        fn, args = (parallel_fn, (self.nt, *args)) if self.parallel else (serial_fn, args)
        if self.execute:
            fn(*args)
        else:
            fn.compile(tuple(numba.typeof(a) for a in args))
