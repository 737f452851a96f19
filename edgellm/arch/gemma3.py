"""Gemma 3 text decoder (gemma3_text): sliding-window and global layers, sandwich norms.

    x = embed(ids) * sqrt(hidden)                     tied lm_head
    a = o_proj(attention(rope_l(q_norm(q_proj(n))), rope_l(k_norm(k_proj(n))), v_proj(n)))
        with n = input_layernorm(x)
    h = x + post_attention_layernorm(a)
    f = down_proj(gelu_tanh(gate_proj(m)) * up_proj(m)),   m = pre_feedforward_layernorm(h)
    y = h + post_feedforward_layernorm(f)
    logits = softcap(lm_head(norm(y)))                 when final_logit_softcapping is set

Every RMSNorm multiplies by (1 + weight). `layer_types` makes each layer sliding (a window of
`sliding_window` positions, kept as a ring of that size, and the sliding RoPE base) or global
(the whole context, the global RoPE base and scaling). Scores scale by
query_pre_attn_scalar**-0.5 and are soft-capped when attn_logit_softcapping is set.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedArchitectureError
from ..modelfile.config import ModelArgs, _round_bf16, rope_inv_freq
from .base import LayerWeights, Transformer
from .llama import ATTENTION, DENSE_MLP
from .spec import REQ, VEC, ArchSpec, TensorSpec
from .steps import Add, Attend, Linear, Norm, dense_mlp

GELU_TANH = (None, "gelu_pytorch_tanh", "gelu_tanh")
SLIDING_THETA = 10000.0  # transformers 4 default of rope_local_base_freq


def embed_scale(args: ModelArgs) -> float:
    """sqrt(hidden_size) as transformers applies it: a float32 buffer, cast to the model's
    dtype (bfloat16 checkpoints round it, e.g. sqrt(3072) = 55.43 -> 55.5)."""
    scale = np.float32(np.sqrt(np.float32(args.hidden_size)))
    if (args.extra.get("dtype") or args.extra.get("torch_dtype")) == "bfloat16":
        return float(_round_bf16(scale))
    return float(scale)


def layer_rope_params(args: ModelArgs, layer_type: str) -> dict:
    """RoPE parameters of a layer type: transformers 5 keeps one dict per type in
    rope_parameters; transformers 4 has rope_theta (+ rope_scaling) for global layers and
    rope_local_base_freq for sliding ones."""
    params = args.rope_parameters
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        return args.rope(layer_type)
    if layer_type == "sliding_attention":
        return {"rope_theta": float(args.rope_local_base_freq or SLIDING_THETA),
                "rope_type": "default"}
    return args.rope()


# q/k norms required; sandwich norms (llama.cpp's ffn_norm is the pre-feed-forward norm)
TENSORS = tuple(TensorSpec(t.name, t.role, t.shape, REQ, t.field, t.gguf)
                if t.field in ("q_norm", "k_norm") else t for t in ATTENTION) + (
    TensorSpec("post_attention_layernorm.weight", VEC, ("hidden",), REQ, "post_attn_norm",
               "post_attention_norm.weight"),
    TensorSpec("pre_feedforward_layernorm.weight", VEC, ("hidden",), REQ, "ffn_norm",
               "ffn_norm.weight"),
    TensorSpec("post_feedforward_layernorm.weight", VEC, ("hidden",), REQ, "post_ffn_norm",
               "post_ffw_norm.weight"),
) + DENSE_MLP


class Gemma3(Transformer):
    """Gemma 3 over packed weights (see the module docstring for the block)."""

    norm_offset = 1.0

    def __init__(self, packed, args: ModelArgs, **kw):
        act = args.hidden_activation
        if act not in GELU_TANH:
            raise UnsupportedArchitectureError(
                f"{packed.path}: gemma3 activation {act!r} is not supported (gelu_pytorch_tanh)")
        super().__init__(packed, args, **kw)
        self.embed_scale = embed_scale(args)
        self.attn_softcap = float(args.attn_logit_softcapping or 0.0)
        self.logit_softcap = float(args.final_logit_softcapping or 0.0)
        scalar = args.query_pre_attn_scalar or args.head_dim
        self._attn_scale = float(scalar) ** -0.5

    def layer_rope(self, i: int) -> tuple[np.ndarray, float]:
        params = layer_rope_params(self.args, self.args.layer_types[i])
        dtype = self.args.extra.get("dtype") or self.args.extra.get("torch_dtype")
        params["_bf16_buffers"] = dtype == "bfloat16"
        return rope_inv_freq(self.args.head_dim, params)

    def attn_scale(self) -> float:
        return self._attn_scale

    def steps(self, i: int, w: LayerWeights) -> list:
        return [Norm("x", w.attn_norm, "h"),
                Linear(w.q, "h", "q", w.q_bias), Linear(w.k, "h", "k", w.k_bias),
                Linear(w.v, "h", "v", w.v_bias),
                Attend(i, q_norm=w.q_norm, k_norm=w.k_norm),
                Linear(w.o, "attn", "h"), Norm("h", w.post_attn_norm, "h"), Add("x", "h"),
                Norm("x", w.ffn_norm, "h"), *dense_mlp(w, act="gelu_tanh"),
                Norm("h", w.post_ffn_norm, "h"), Add("x", "h")]


SPEC = ArchSpec(model_types=("gemma3_text",), family="gemma3", model=Gemma3, tensors=TENSORS,
                gguf={"gemma3": ("gemma3_text", "Gemma3ForCausalLM")})
