"""Model hyper-parameters from a Hugging Face config dict (both transformers 4 and 5 forms)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError


@dataclass
class ModelArgs:
    """The fields the runtime uses, named as in Hugging Face configs."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int = 0
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    use_sliding_window: bool = True
    layer_types: list[str] | None = None
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_parameters: dict | None = None
    attention_bias: bool = False
    hidden_act: str = "silu"
    # gemma3
    hidden_activation: str | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    rope_local_base_freq: float | None = None  # transformers 4: RoPE base of sliding layers
    sliding_window_pattern: int | None = None  # transformers 4: every n-th layer is global
    # phi3 (transformers 4 spelling; 5 puts it in rope_parameters)
    partial_rotary_factor: float | None = None
    # mixture of experts (qwen3_moe, mixtral)
    num_local_experts: int = 0  # mixtral; transformers 5 qwen3_moe
    num_experts: int = 0  # transformers 4 qwen3_moe
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # qwen3_moe; mixtral's experts use intermediate_size
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    bos_token_id: int | list | None = None
    eos_token_id: int | list | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, config: dict) -> ModelArgs:
        """Build from config.json contents; unknown keys are kept in `extra`."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in config.items() if k in names}
        try:
            args = cls(**known, extra={k: v for k, v in config.items() if k not in names})
        except TypeError as e:
            raise FormatError(f"model config: {e}") from None
        args._validate()
        return args

    def _validate(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "vocab_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v > 1 << 24:
                raise FormatError(f"model config: field {name!r} is {v!r}")
        if not self.num_key_value_heads:
            self.num_key_value_heads = self.num_attention_heads
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise FormatError(f"model config: {self.num_attention_heads} attention heads do "
                              f"not split into {self.num_key_value_heads} key/value heads")
        if self.head_dim % 2:
            raise FormatError(f"model config: head_dim {self.head_dim} is odd")
        if self.layer_types is None and self.model_type == "gemma3_text":
            # transformers 4 configs: a global layer every `sliding_window_pattern` layers
            n = self.sliding_window_pattern or self.extra.get("_sliding_window_pattern") or 6
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise FormatError(f"model config: sliding_window_pattern is {n!r}")
            self.layer_types = ["sliding_attention" if (i + 1) % n else "full_attention"
                                for i in range(self.num_hidden_layers)]
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise FormatError("model config: layer_types does not list every layer")

    def layer_window(self, layer: int) -> int:
        """Sliding-window length of `layer` (0 = full attention)."""
        if not self.sliding_window or not self.use_sliding_window:
            return 0
        if self.layer_types is not None:
            return int(self.sliding_window) if self.layer_types[layer] == "sliding_attention" \
                else 0
        return int(self.sliding_window)

    def rope(self, layer_type: str | None = None) -> dict:
        """RoPE parameters {rope_theta, rope_type, ...} (transformers 5 `rope_parameters`,
        or transformers 4 `rope_theta` + `rope_scaling`)."""
        params = self.rope_parameters
        if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type],
                                                                            dict):
            params = params[layer_type]
        if isinstance(params, dict) and "rope_theta" in params:
            out = dict(params)
        else:
            out = dict(self.rope_scaling or {})
            out["rope_theta"] = self.rope_theta
        out.setdefault("rope_type", out.pop("type", "default"))
        return out


def rope_inv_freq(head_dim: int, params: dict) -> tuple[np.ndarray, float]:
    """(inv_freq float64 [head_dim/2], attention scaling) as transformers computes them."""
    theta = float(params.get("rope_theta", 10000.0))
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float64) / head_dim)
    kind = params.get("rope_type", "default")
    inv, scaling = _scaled_inv_freq(inv, kind, params)
    # transformers keeps inv_freq as a buffer, rounded when a model is cast to bfloat16:
    # the reference outputs of bf16 checkpoints use the rounded frequencies.
    return (_round_bf16(inv) if params.get("_bf16_buffers") else inv), scaling


def _scaled_inv_freq(inv: np.ndarray, kind: str, params: dict) -> tuple[np.ndarray, float]:
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(params["factor"]), 1.0
    if kind == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_ctx = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old_ctx / low, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
        return np.where(medium, smoothed, out), 1.0
    raise FormatError(f"model config: rope type {kind!r} is not supported")


def _round_bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)
