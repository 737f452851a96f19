"""A decoder block as data: the steps an architecture's block runs, over named buffers.

An architecture's `steps(i, w)` returns layer i's block as a list of these records; the
per-operation path (`run`, below: one kernel call per step over a chunk of T tokens) and
the fused decode step (step/fused.py compiles the same list into one parallel region per
token) both execute it, so a block is written once.

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


@dataclass(frozen=True)
class Norm:
    src: str
    weight: np.ndarray
    dst: str


@dataclass(frozen=True)
class Linear:
    w: Tensor
    src: str
    dst: str | tuple[str, ...]
    bias: np.ndarray | None = None
    float_acts: bool = False  # float activations even on the int8 path (routers)
    widths: tuple[int, ...] = ()  # with a tuple dst: each output's columns

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.dst if isinstance(self.dst, tuple) else (self.dst,)


@dataclass(frozen=True)
class Attend:
    layer: int
    q: str = "q"
    k: str = "k"
    v: str = "v"
    dst: str = "attn"
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    perm: np.ndarray | None = None


@dataclass(frozen=True)
class Act:
    kind: str
    gate: str
    up: str
    dst: str


@dataclass(frozen=True)
class Add:
    dst: str
    src: str
    scale: float = 1.0


@dataclass(frozen=True)
class Experts:
    w: object  # the layer's MoEWeights (router, experts)
    src: str
    dst: str


def dense_mlp(w, norm_out: str = "h", act: str = "silu") -> list:
    """gate/up of the normed row, the gated activation, down into "h"."""
    return [Linear(w.gate, norm_out, "gate"), Linear(w.up, norm_out, "up"),
            Act(act, "gate", "up", "ffn"), Linear(w.down, "ffn", "h")]


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

    def run(self, steps: list, T: int, positions: np.ndarray, attend) -> None:
        """Run `steps` over rows [:T] at `positions` [T]; attend(s, q, k, v, out, T,
        positions): the Attend step's function (Transformer.forward_rows': each sequence's
        rows over its own cache)."""
        m = self.model
        a = m.args
        b = self.bufs
        acts: dict[str, object] = {}  # buffer name -> its int8 copy (hidden-wide rows)
        widths = {"x": a.hidden_size}

        def get(name: str, width: int | None = None) -> np.ndarray:
            width = widths[name] if width is None else width
            widths[name] = width
            return self.buffer(name, width, T)

        for s in steps:
            if isinstance(s, Norm):
                D = s.weight.shape[0]
                rmsnorm(get(s.src), s.weight, a.rms_norm_eps, m.norm_offset, get(s.dst, D))
                acts.pop(s.dst, None)
            elif isinstance(s, Linear):
                x = get(s.src)
                act = None
                if m.int8_acts and x.shape[1] == a.hidden_size and not s.float_acts:
                    act = acts.get(s.src)
                    if act is None:
                        act = acts[s.src] = quantize_act(x, b.act_d)
                N = s.w.shape[0]
                outs = s.outputs
                out = get(outs[0], N) if len(outs) == 1 else get("+".join(outs), N)
                linear(s.w, x, out, precise=m.precise or s.float_acts, act=act,
                       act_dtype=m.act_dtype)
                delta = m.lora.get(s.w.name)
                if delta is not None:  # LoRA: out += (x @ A.T) @ BT, in float
                    out += (x @ delta.A.T) @ delta.BT
                if s.bias is not None:
                    out += s.bias
                if len(outs) > 1:
                    c = 0
                    for name, n in zip(outs, s.widths):
                        get(name, n)[:] = out[:, c:c + n]
                        acts.pop(name, None)
                        c += n
                acts.pop(outs[0], None)
            elif isinstance(s, Attend):
                Hq, Hkv = a.num_attention_heads, a.num_key_value_heads
                Dh = a.head_dim
                attend(s, get(s.q, Hq * Dh), get(s.k, Hkv * Dh), get(s.v, Hkv * Dh),
                         get(s.dst, Hq * Dh), T, positions)
                acts.pop(s.dst, None)
            elif isinstance(s, Act):
                gate, up = get(s.gate), get(s.up)
                out = get(s.dst, gate.shape[1])
                (swiglu if s.kind == "silu" else geglu_tanh)(gate, up, out)
                acts.pop(s.dst, None)
            elif isinstance(s, Add):
                dst, src = get(s.dst), get(s.src)
                if s.scale != 1.0:
                    dst += src * np.float32(s.scale)
                else:
                    add_inplace(dst, src)
                acts.pop(s.dst, None)
            elif isinstance(s, Experts):
                x = get(s.src)
                act = acts.get(s.src)
                if act is None and m.int8_acts:
                    act = acts[s.src] = quantize_act(x, b.act_d)
                m.sparse_mlp(s.w, x, act, get(s.dst))
                acts.pop(s.dst, None)
            else:
                raise TypeError(f"unknown step {s!r}")
