"""OLMo 2 (olmo2): post-norm blocks, q/k RMSNorm over the whole projection.

    q = q_norm(q_proj(x)),  k = k_norm(k_proj(x))     one norm over all heads' dims
    h = x + post_attention_layernorm(o_proj(attention(rope(q), rope(k), v_proj(x))))
    y = h + post_feedforward_layernorm(down_proj(silu(gate_proj(h)) * up_proj(h)))

No norm before attention or the MLP: the sublayers read the residual stream itself.
"""

from __future__ import annotations

from .base import LayerWeights, Transformer
from .llama import DENSE_MLP
from .spec import MAT, REQ, VEC, ArchSpec, TensorSpec
from .steps import Add, Attend, Linear, Norm, dense_mlp

TENSORS = tuple(TensorSpec(n, r, s, REQ, f) for f, n, r, s in (
    ("q", "self_attn.q_proj.weight", MAT, ("q", "hidden")),
    ("k", "self_attn.k_proj.weight", MAT, ("kv", "hidden")),
    ("v", "self_attn.v_proj.weight", MAT, ("kv", "hidden")),
    ("o", "self_attn.o_proj.weight", MAT, ("hidden", "q")),
    ("q_norm", "self_attn.q_norm.weight", VEC, ("q",)),
    ("k_norm", "self_attn.k_norm.weight", VEC, ("kv",)),
    ("post_attn_norm", "post_attention_layernorm.weight", VEC, ("hidden",)),
    ("post_ffn_norm", "post_feedforward_layernorm.weight", VEC, ("hidden",)),
)) + DENSE_MLP


class Olmo2(Transformer):
    """OLMo 2 over packed weights (see the module docstring)."""

    def steps(self, i: int, w: LayerWeights) -> list:
        return [Linear(w.q, "x", "q"), Linear(w.k, "x", "k"), Linear(w.v, "x", "v"),
                Norm("q", w.q_norm, "q"), Norm("k", w.k_norm, "k"),
                Attend(i),
                Linear(w.o, "attn", "h"), Norm("h", w.post_attn_norm, "h"), Add("x", "h"),
                *dense_mlp(w, norm_out="x"), Norm("h", w.post_ffn_norm, "h"), Add("x", "h")]


SPEC = ArchSpec(model_types=("olmo2",), family="olmo2", model=Olmo2, tensors=TENSORS)
