"""Llama family: llama (default and llama3 RoPE), mistral (sliding window), qwen2 (q/k/v
biases), qwen3 (per-head q/k RMSNorm), SmolLM. One block:

    h = x + o_proj(attention(rope(q_proj(norm(x))), rope(k_proj(.)), v_proj(.)))
    y = h + down_proj(silu(gate_proj(norm(h))) * up_proj(norm(h)))
"""

from __future__ import annotations

from .base import LayerWeights, Transformer
from .steps import Add, Attend, Linear, Norm, dense_mlp


class Llama(Transformer):
    """Decoder-only llama-style transformer over packed weights."""

    norm_offset = 0.0

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

    def attention_steps(self, i: int, w: LayerWeights) -> list:
        """h = x + o_proj(attention(...)): the attention half every llama-style block has."""
        return [Norm("x", w.attn_norm, "h"),
                Linear(w.q, "h", "q", w.q_bias), Linear(w.k, "h", "k", w.k_bias),
                Linear(w.v, "h", "v", w.v_bias),
                Attend(i, q_norm=w.q_norm, k_norm=w.k_norm),
                Linear(w.o, "attn", "h"), Add("x", "h")]

    def steps(self, i: int, w: LayerWeights) -> list:
        return (self.attention_steps(i, w) + [Norm("x", w.ffn_norm, "h")] + dense_mlp(w)
                + [Add("x", "h")])
