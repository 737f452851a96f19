"""Phi-3 (phi3): the llama block with fused projections, kept fused in the file.

    qkv = qkv_proj(norm(x))        one linear call; output columns are [q | k | v]
    h = x + o_proj(attention(rope(q), rope(k), v))
    gu = gate_up_proj(norm(h))     one linear call; output columns are [gate | up]
    y = h + down_proj(silu(gate) * up)

partial_rotary_factor < 1 rotates only the first `rot` dims of each q/k head (rotate-half
within them). Attention reads q and k with their head dims permuted the same way (which
leaves every q.k product unchanged) so that the shared full-width RoPE kernel, with zero
frequencies on the pass-through dims, does exactly that; the KV cache's context shift
then re-ropes keys correctly too. A sliding_window in the config applies to every layer,
as transformers' Phi3 does. longrope ("su") scaling (the 128k models) is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FormatError, UnsupportedArchitectureError
from ..modelfile.config import ModelArgs, rope_inv_freq
from ..modelfile.format import Tensor
from .base import LayerWeights, Transformer
from .spec import MAT, VEC, ArchSpec, TensorSpec
from .steps import Act, Add, Attend, Linear, Norm


@dataclass
class Phi3Weights(LayerWeights):
    """q/k/v, gate and up are None: Phi-3 keeps them fused."""

    qkv: Tensor | None = None
    gate_up: Tensor | None = None


def rotary_dims(args: ModelArgs) -> int:
    """How many leading dims of each head RoPE rotates (transformers: int(hd * factor))."""
    params = args.rope()
    factor = params.get("partial_rotary_factor", args.partial_rotary_factor)
    rot = int(args.head_dim * float(1.0 if factor is None else factor))
    if rot <= 0 or rot > args.head_dim or rot % 2:
        raise FormatError(f"model config: partial_rotary_factor {factor} gives {rot} rotary "
                          f"dims of head_dim {args.head_dim} (need an even number > 0)")
    return rot


def head_permutation(head_dim: int, rot: int) -> np.ndarray:
    """Order of a head's dims that puts rotate-half pairs (i, i + rot/2) of the first `rot`
    dims at (i, i + head_dim/2), and pairs the pass-through dims with each other."""
    r, p = rot // 2, (head_dim - rot) // 2
    return np.concatenate([np.arange(0, r), np.arange(rot, rot + p),
                           np.arange(r, rot), np.arange(rot + p, head_dim)])


TENSORS = tuple(TensorSpec(n, r, s, True, f, None) for f, n, r, s in (
    ("attn_norm", "input_layernorm.weight", VEC, ("hidden",)),
    ("qkv", "self_attn.qkv_proj.weight", MAT, ("qkv", "hidden")),
    ("o", "self_attn.o_proj.weight", MAT, ("hidden", "q")),
    ("ffn_norm", "post_attention_layernorm.weight", VEC, ("hidden",)),
    ("gate_up", "mlp.gate_up_proj.weight", MAT, ("gate_up", "hidden")),
    ("down", "mlp.down_proj.weight", MAT, ("hidden", "inter")),
))


def check_config(where: str, a: ModelArgs) -> None:
    """The rotary dims as rotary_dims computes them, with the file named."""
    factor = a.rope().get("partial_rotary_factor", a.partial_rotary_factor)
    rot = int(a.head_dim * float(1.0 if factor is None else factor))
    if rot <= 0 or rot > a.head_dim or rot % 2:
        raise FormatError(f"{where}: config partial_rotary_factor {_short(factor)} gives "
                          f"{rot} rotary dims of head_dim {a.head_dim} (need an even "
                          "number > 0)")


class Phi3(Transformer):
    """Phi-3 over packed weights (see the module docstring)."""

    weights_class = Phi3Weights

    def __init__(self, packed, args: ModelArgs, **kw):
        kind = args.rope().get("rope_type", "default")
        if kind in ("longrope", "su", "yarn"):
            raise UnsupportedArchitectureError(
                f"{packed.path}: phi3 {kind!r} RoPE scaling (the long-context Phi-3 models) "
                "is not supported")
        if args.hidden_act != "silu":
            raise UnsupportedArchitectureError(
                f"{packed.path}: phi3 activation {args.hidden_act!r} is not supported (silu)")
        self.rot = rotary_dims(args)
        super().__init__(packed, args, **kw)
        # q and k head dims read permuted (see the module docstring)
        self.perm = (head_permutation(args.head_dim, self.rot) if self.rot != args.head_dim
                     else None)

    def ffn_width(self) -> int:
        return self.layers[0].gate_up.shape[0] // 2

    def layer_weights(self, i: int) -> Phi3Weights:
        a = self.args
        w = super().layer_weights(i)
        rows = (a.num_attention_heads + 2 * a.num_key_value_heads) * a.head_dim
        if w.qkv.shape[0] != rows:
            raise FormatError(f"{self.packed.path}: {w.qkv.name} has {w.qkv.shape[0]} rows, "
                              f"expected {rows} (q, k and v heads)")
        if w.gate_up.shape[0] != 2 * w.down.shape[1]:
            raise FormatError(f"{self.packed.path}: {w.gate_up.name} has "
                              f"{w.gate_up.shape[0]} rows, expected 2 x {w.down.shape[1]}")
        return w

    def layer_rope(self, i: int) -> tuple[np.ndarray, float]:
        params = self.args.rope()
        dtype = self.args.extra.get("dtype") or self.args.extra.get("torch_dtype")
        params["_bf16_buffers"] = dtype == "bfloat16"
        inv, scaling = rope_inv_freq(self.rot, params)
        pad = np.zeros((self.args.head_dim - self.rot) // 2)  # pass-through dims: angle 0
        return np.concatenate([inv, pad]), scaling

    def steps(self, i: int, w: Phi3Weights) -> list:
        a = self.args
        qd, kvd = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
        F = self.ffn_width()
        return [Norm("x", w.attn_norm, "h"),
                Linear(w.qkv, "h", ("q", "k", "v"), widths=(qd, kvd, kvd)),
                Attend(i, perm=self.perm),
                Linear(w.o, "attn", "h"), Add("x", "h"),
                Norm("x", w.ffn_norm, "h"),
                Linear(w.gate_up, "h", ("gate", "up"), widths=(F, F)),
                Act("silu", "gate", "up", "ffn"), Linear(w.down, "ffn", "h"), Add("x", "h")]


def _short(value) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:60] + "..."


SPEC = ArchSpec(model_types=("phi3",), family="phi3", model=Phi3, tensors=TENSORS,
                check=check_config)
