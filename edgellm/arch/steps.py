"""A decoder block as data: the steps an architecture's block runs, over named buffers.

An architecture's `steps(i, w)` returns layer i's block as a list of these records; the
per-operation path (each step's `run`: one kernel call over a chunk of T tokens, through
StepRunner.run) and the fused decode step (step/fused.py compiles the same list into one
parallel region per token) both execute it, so a block is written once.

Buffers are named rows [T, width]: "x" (the residual stream), "h" (a normed or projected
row), "q", "k", "v", "attn", "gate", "up", "ffn", and any other name an architecture uses
(its per-operation buffer is allocated on first use).

    Norm(src, weight, dst)           dst = src / rms(src) * (weight + model.norm_offset)
    Linear(w, src, dst, bias)        dst = src @ W.T (+ bias); dst a tuple: W's output
                                     columns split in that order ([q | k | v])
    Attend(layer, q, k, v, dst, ...) q/k norm (optional), RoPE, attention over the layer's
                                     cache plus these tokens, k/v stored; perm: each q/k
                                     head's dims read in that order (Phi-3 partial RoPE)
    Act(kind, gate, up, dst)         dst = silu(gate) * up | gelu_tanh(gate) * up
    Add(dst, src, scale)             dst += src (* scale)
    Experts(w, src, dst)             dst += the routed experts' outputs on src (arch/moe.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.activations import geglu_tanh, swiglu
from ..kernels.linear import linear, quantize_act
from ..kernels.norms import add_inplace, rmsnorm
from ..modelfile.format import Tensor

ACTIVATIONS = ("silu", "gelu_tanh")


class Step:
    """A step of a block; `run(c)` runs it over a Chunk (the per-operation path)."""

    def run(self, c: Chunk) -> None:
        raise TypeError(f"unknown step {self!r}")


@dataclass(frozen=True)
class Norm(Step):
    src: str
    weight: np.ndarray
    dst: str

    def run(self, c: Chunk) -> None:
        m = c.model
        D = self.weight.shape[0]
        rmsnorm(c.get(self.src), self.weight, m.args.rms_norm_eps, m.norm_offset,
                c.get(self.dst, D))
        c.acts.pop(self.dst, None)


@dataclass(frozen=True)
class Linear(Step):
    w: Tensor
    src: str
    dst: str | tuple[str, ...]
    bias: np.ndarray | None = None
    float_acts: bool = False  # float activations even on the int8 path (routers)
    widths: tuple[int, ...] = ()  # with a tuple dst: each output's columns

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.dst if isinstance(self.dst, tuple) else (self.dst,)

    def run(self, c: Chunk) -> None:
        m = c.model
        x = c.get(self.src)
        act = None
        if m.int8_acts and x.shape[1] == m.args.hidden_size and not self.float_acts:
            act = c.int8(self.src, x)
        N = self.w.shape[0]
        outs = self.outputs
        out = c.get(outs[0], N) if len(outs) == 1 else c.get("+".join(outs), N)
        linear(self.w, x, out, precise=m.precise or self.float_acts, act=act,
               act_dtype=m.act_dtype)
        delta = m.lora.get(self.w.name)
        if delta is not None:  # LoRA: out += (x @ A.T) @ BT, in float
            out += (x @ delta.A.T) @ delta.BT
        if self.bias is not None:
            out += self.bias
        if len(outs) > 1:
            col = 0
            for name, n in zip(outs, self.widths):
                c.get(name, n)[:] = out[:, col:col + n]
                c.acts.pop(name, None)
                col += n
        c.acts.pop(outs[0], None)


@dataclass(frozen=True)
class Attend(Step):
    layer: int
    q: str = "q"
    k: str = "k"
    v: str = "v"
    dst: str = "attn"
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    perm: np.ndarray | None = None

    def run(self, c: Chunk) -> None:
        a = c.model.args
        Hq, Hkv, Dh = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        c.attend(self, c.get(self.q, Hq * Dh), c.get(self.k, Hkv * Dh), c.get(self.v, Hkv * Dh),
                 c.get(self.dst, Hq * Dh), c.T, c.positions)
        c.acts.pop(self.dst, None)


@dataclass(frozen=True)
class Act(Step):
    kind: str
    gate: str
    up: str
    dst: str

    def run(self, c: Chunk) -> None:
        gate, up = c.get(self.gate), c.get(self.up)
        out = c.get(self.dst, gate.shape[1])
        (swiglu if self.kind == "silu" else geglu_tanh)(gate, up, out)
        c.acts.pop(self.dst, None)


@dataclass(frozen=True)
class Add(Step):
    dst: str
    src: str
    scale: float = 1.0

    def run(self, c: Chunk) -> None:
        dst, src = c.get(self.dst), c.get(self.src)
        if self.scale != 1.0:
            dst += src * np.float32(self.scale)
        else:
            add_inplace(dst, src)
        c.acts.pop(self.dst, None)


@dataclass(frozen=True)
class Experts(Step):
    w: object  # the layer's MoEWeights (router, experts)
    src: str
    dst: str

    def run(self, c: Chunk) -> None:
        m = c.model
        x = c.get(self.src)
        act = c.int8(self.src, x) if m.int8_acts else c.acts.get(self.src)
        m.sparse_mlp(self.w, x, act, c.get(self.dst))
        c.acts.pop(self.dst, None)


def dense_mlp(w, norm_out: str = "h", act: str = "silu") -> list:
    """gate/up of the normed row, the gated activation, down into "h"."""
    return [Linear(w.gate, norm_out, "gate"), Linear(w.up, norm_out, "up"),
            Act(act, "gate", "up", "ffn"), Linear(w.down, "ffn", "h")]


class Chunk:
    """What a step's `run` works on: the model, rows [:T] of its named buffers (StepRunner's),
    their int8 copies (acts: buffer name -> its copy, hidden-wide rows; a step that writes a
    buffer drops its copy), the chunk's positions and the Attend step's function."""

    def __init__(self, runner: StepRunner, T: int, positions: np.ndarray, attend):
        self.runner, self.model, self.T, self.positions = runner, runner.model, T, positions
        self.attend = attend
        self.acts: dict[str, object] = {}
        self.widths = {"x": runner.model.args.hidden_size}

    def get(self, name: str, width: int | None = None) -> np.ndarray:
        """Buffer `name`'s rows [:T]: `width` wide (and that width from now on), else the
        width it was last given."""
        width = self.widths[name] if width is None else width
        self.widths[name] = width
        return self.runner.buffer(name, width, self.T)

    def int8(self, name: str, x: np.ndarray):
        """Buffer `name`'s int8 copy (x, its rows), quantized on first use."""
        act = self.acts.get(name)
        if act is None:
            act = self.acts[name] = quantize_act(x, self.runner.bufs.act_d)
        return act


class StepRunner:
    """The per-operation path: each step one kernel call over a chunk (model: a Transformer,
    bufs: its Buffers)."""

    def __init__(self, model, bufs):
        self.model, self.bufs = model, bufs
        self.extra: dict[str, np.ndarray] = {}

    def buffer(self, name: str, width: int, T: int) -> np.ndarray:
        b = self.bufs
        arr = getattr(b, name, None)
        if not isinstance(arr, np.ndarray) or arr.shape[1] != width:
            arr = self.extra.get(name)
            if arr is None or arr.shape[1] != width:
                arr = self.extra[name] = np.zeros((b.x.shape[0], width), np.float32)
        return arr[:T]

    def run(self, steps: list, T: int, positions: np.ndarray, attend=None) -> None:
        """Run `steps` over rows [:T] at `positions` [T], each its own `run`; attend(s, q,
        k, v, out, T, positions): the Attend step's function (Transformer.forward_rows':
        each sequence's rows over its own cache; None where `steps` have no Attend)."""
        c = Chunk(self, T, positions, attend)
        for s in steps:
            s.run(c)
