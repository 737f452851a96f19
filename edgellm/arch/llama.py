"""Llama family: llama (default and llama3 RoPE), mistral (sliding window), qwen2 (q/k/v
biases), qwen3 (per-head q/k RMSNorm), SmolLM. One block:

    h = x + o_proj(attention(rope(q_proj(norm(x))), rope(k_proj(.)), v_proj(.)))
    y = h + down_proj(silu(gate_proj(norm(h))) * up_proj(norm(h)))
"""

from __future__ import annotations

import os

import numpy as np

from ..config import ModelArgs
from ..kernels.activations import swiglu
from ..kernels.linear import linear, quantize_act
from ..kernels.norms import add_inplace, rmsnorm, rmsnorm_heads
from .base import Buffers, LayerWeights, Transformer
from .fused import FusedDecoder


class Llama(Transformer):
    """Decoder-only llama-style transformer over packed weights."""

    norm_offset = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if os.environ.get("EDGELLM_FUSED", "1") != "0":
            self.fused = FusedDecoder.build(self)

    def layer_weights(self, i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(
            attn_norm=self.vector(p + "input_layernorm.weight"),
            q=self.matrix(p + "self_attn.q_proj.weight"),
            k=self.matrix(p + "self_attn.k_proj.weight"),
            v=self.matrix(p + "self_attn.v_proj.weight"),
            o=self.matrix(p + "self_attn.o_proj.weight"),
            q_bias=self.vector(p + "self_attn.q_proj.bias", optional=True),
            k_bias=self.vector(p + "self_attn.k_proj.bias", optional=True),
            v_bias=self.vector(p + "self_attn.v_proj.bias", optional=True),
            q_norm=self.vector(p + "self_attn.q_norm.weight", optional=True),
            k_norm=self.vector(p + "self_attn.k_norm.weight", optional=True),
            ffn_norm=self.vector(p + "post_attention_layernorm.weight"),
            gate=self.matrix(p + "mlp.gate_proj.weight"),
            up=self.matrix(p + "mlp.up_proj.weight"),
            down=self.matrix(p + "mlp.down_proj.weight"),
        )

    def block(self, i: int, w: LayerWeights, b: Buffers, T: int, positions: np.ndarray) -> None:
        a: ModelArgs = self.args
        x, h = b.x[:T], b.h[:T]
        rmsnorm(x, w.attn_norm, a.rms_norm_eps, self.norm_offset, h)
        act = quantize_act(h, b.act_d) if self.int8_acts else None
        q, k, v = b.q[:T], b.k[:T], b.v[:T]
        linear(w.q, h, q, precise=self.precise, act=act)
        linear(w.k, h, k, precise=self.precise, act=act)
        linear(w.v, h, v, precise=self.precise, act=act)
        for bias, out in ((w.q_bias, q), (w.k_bias, k), (w.v_bias, v)):
            if bias is not None:
                out += bias
        self.attend(i, w, b, T, positions)
        linear(w.o, b.attn[:T], h, precise=self.precise)
        add_inplace(x, h)
        rmsnorm(x, w.ffn_norm, a.rms_norm_eps, self.norm_offset, h)
        act = quantize_act(h, b.act_d) if self.int8_acts else None
        linear(w.gate, h, b.gate[:T], precise=self.precise, act=act)
        linear(w.up, h, b.up[:T], precise=self.precise, act=act)
        swiglu(b.gate[:T], b.up[:T], b.ffn[:T])
        linear(w.down, b.ffn[:T], h, precise=self.precise)
        add_inplace(x, h)

    def qk_norm(self, w: LayerWeights, q: np.ndarray, k: np.ndarray) -> None:
        if w.q_norm is not None:
            rmsnorm_heads(q, w.q_norm, self.args.rms_norm_eps, self.norm_offset)
        if w.k_norm is not None:
            rmsnorm_heads(k, w.k_norm, self.args.rms_norm_eps, self.norm_offset)
