"""IBM Granite (granite): the llama block with four multipliers from the config.

    x = embed(ids) * embedding_multiplier
    h = x + residual_multiplier * o_proj(attention(...))      scores scaled by
                                                              attention_multiplier
    y = h + residual_multiplier * down_proj(silu(gate_proj(n)) * up_proj(n))
    logits = lm_head(norm(y)) / logits_scaling
"""

from __future__ import annotations

import math

from ..errors import FormatError
from .base import LayerWeights
from .llama import ATTENTION, DENSE_MLP, FFN_NORM, Llama
from .spec import ArchSpec
from .steps import Add, Norm, dense_mlp

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
               "logits_scaling")


def multiplier(args, name: str) -> float:
    return float(args.extra.get(name, 1.0))


def check_config(where: str, args) -> None:
    for name in MULTIPLIERS:
        value = args.extra.get(name, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise FormatError(f"{where}: config field {name!r} is {value!r}, expected a "
                              "positive number")


class Granite(Llama):
    """Granite over packed weights (see the module docstring)."""

    def __init__(self, packed, args, **kw):
        super().__init__(packed, args, **kw)
        self.embed_scale = multiplier(args, "embedding_multiplier")
        self.logit_scale = 1.0 / multiplier(args, "logits_scaling")
        self.residual = multiplier(args, "residual_multiplier")

    def attn_scale(self) -> float:
        return multiplier(self.args, "attention_multiplier")

    def steps(self, i: int, w: LayerWeights) -> list:
        attn = self.attention_steps(i, w)[:-1]  # the residual add, scaled below
        return (attn + [Add("x", "h", self.residual), Norm("x", w.ffn_norm, "h")]
                + dense_mlp(w) + [Add("x", "h", self.residual)])


SPEC = ArchSpec(model_types=("granite",), family="granite", model=Granite,
                tensors=ATTENTION + (FFN_NORM,) + DENSE_MLP, check=check_config)
