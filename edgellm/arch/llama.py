"""Llama family: llama (default and llama3 RoPE), mistral (sliding window), qwen2 (q/k/v
biases), qwen3 (per-head q/k RMSNorm), SmolLM. One block:

    h = x + o_proj(attention(rope(q_proj(norm(x))), rope(k_proj(.)), v_proj(.)))
    y = h + down_proj(silu(gate_proj(norm(h))) * up_proj(norm(h)))
"""

from __future__ import annotations

from .base import LayerWeights, Transformer
from .spec import MAT, OPT, VEC, ArchSpec, TensorSpec
from .steps import Add, Attend, Linear, Norm, dense_mlp

# The attention half every llama-style block has: (field, name, role, shape, required, gguf)
ATTENTION = tuple(TensorSpec(n, r, s, q, f, g) for f, n, r, s, q, g in (
    ("attn_norm", "input_layernorm.weight", VEC, ("hidden",), True, "attn_norm.weight"),
    ("q", "self_attn.q_proj.weight", MAT, ("q", "hidden"), True, "attn_q.weight"),
    ("k", "self_attn.k_proj.weight", MAT, ("kv", "hidden"), True, "attn_k.weight"),
    ("v", "self_attn.v_proj.weight", MAT, ("kv", "hidden"), True, "attn_v.weight"),
    ("o", "self_attn.o_proj.weight", MAT, ("hidden", "q"), True, "attn_output.weight"),
    ("q_bias", "self_attn.q_proj.bias", VEC, ("q",), OPT, "attn_q.bias"),
    ("k_bias", "self_attn.k_proj.bias", VEC, ("kv",), OPT, "attn_k.bias"),
    ("v_bias", "self_attn.v_proj.bias", VEC, ("kv",), OPT, "attn_v.bias"),
    ("q_norm", "self_attn.q_norm.weight", VEC, ("head_dim",), OPT, "attn_q_norm.weight"),
    ("k_norm", "self_attn.k_norm.weight", VEC, ("head_dim",), OPT, "attn_k_norm.weight"),
))
FFN_NORM = TensorSpec("post_attention_layernorm.weight", VEC, ("hidden",), True, "ffn_norm",
                      "ffn_norm.weight")
# The gains converter/norm_fold.py folded into the q8_0 projections a norm feeds, kept for
# LoRA at run time (lora/attach.py reads them through the header's quantization.folded_gains)
FOLDED_GAIN = "folded_gain"
FOLDED_GAINS = tuple(TensorSpec(f"{norm}.{FOLDED_GAIN}", VEC, ("hidden",), OPT)
                     for norm in ("input_layernorm", "post_attention_layernorm"))
DENSE_MLP = tuple(TensorSpec(n, MAT, s, True, f, g) for f, n, s, g in (
    ("gate", "mlp.gate_proj.weight", ("inter", "hidden"), "ffn_gate.weight"),
    ("up", "mlp.up_proj.weight", ("inter", "hidden"), "ffn_up.weight"),
    ("down", "mlp.down_proj.weight", ("hidden", "inter"), "ffn_down.weight"),
))


class Llama(Transformer):
    """Decoder-only llama-style transformer over packed weights."""

    norm_offset = 0.0

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


SPEC = ArchSpec(
    model_types=("llama", "mistral", "qwen2", "qwen3", "smollm", "smollm2", "smollm3"),
    family="llama", model=Llama, tensors=ATTENTION + (FFN_NORM,) + DENSE_MLP + FOLDED_GAINS,
    gguf={"llama": ("llama", "LlamaForCausalLM"), "mistral": ("mistral", "MistralForCausalLM"),
          "qwen2": ("qwen2", "Qwen2ForCausalLM"), "qwen3": ("qwen3", "Qwen3ForCausalLM")})
