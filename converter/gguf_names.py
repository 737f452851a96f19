"""GGUF names -> Hugging Face names: tensor table, Q/K row order, config.json from metadata.

Everything here is llama.cpp convention written down as data: how `convert_hf_to_gguf.py`
renames tensors (each architecture's tensor table in edgellm/arch/ carries its GGUF names),
which architectures it stores with permuted Q/K rows, and which metadata keys carry the
hyperparameters. `gguf_source` applies it to a file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgellm.arch.registry import specs
from edgellm.arch.spec import GLOBAL
from edgellm.errors import SourceError, UnsupportedArchitectureError


def _tables() -> tuple[dict, dict]:
    """From every architecture's spec (edgellm/arch/spec.py): general.architecture ->
    (HF model_type, HF architectures entry), and -> (whole-model names, per-block names
    without the "blk.N." prefix), GGUF name -> HF name."""
    archs, tables = {}, {}
    global_names = {t.gguf: t.name for t in GLOBAL if t.gguf}
    for spec in dict.fromkeys(specs().values()):
        block = {t.gguf: t.name for t in spec.tensors if t.gguf}
        for arch, entry in spec.gguf.items():
            archs[arch] = entry
            tables[arch] = (global_names, block)
    return archs, tables


ARCHITECTURES, TENSOR_TABLES = _tables()

# llama.cpp's LlamaModel.permute reorders the rows of Q and K (weights and biases) so that
# its interleaved ("normal") RoPE applies to HF's rotate-half layout. Qwen2/Qwen3 use NEOX
# RoPE in llama.cpp and are stored unpermuted.
PERMUTED_QK_ARCHS = frozenset({"llama", "mistral"})

# llama.cpp stores Gemma's (1 + weight) RMSNorm weights with the 1 added (every tensor named
# *norm.weight); HF keeps the bare weight: value_offset(...) is what to add to get it back.
NORM_SHIFT: dict[str, float] = {"gemma3": 1.0}

# Tensors that carry no weight of the HF model: rope_freqs becomes config (llama3 rope).
SKIPPED_TENSORS = frozenset({"rope_freqs.weight"})

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


def model_type(arch: str) -> str:
    """HF model_type for a GGUF general.architecture; UnsupportedArchitectureError if unknown."""
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[arch][0]


def hf_tensor_name(arch: str, name: str) -> str | None:
    """HF name of GGUF tensor `name`, or None if the table does not know it."""
    global_names, block_names = TENSOR_TABLES[arch]
    if name in global_names:
        return global_names[name]
    m = _BLOCK_RE.fullmatch(name)
    if m and m.group(2) in block_names:
        return f"model.layers.{int(m.group(1))}.{block_names[m.group(2)]}"
    return None


def value_offset(arch: str, name: str) -> float:
    """What to add to GGUF tensor `name`'s values to get the HF tensor (0.0: nothing)."""
    if name.endswith("norm.weight"):
        return -NORM_SHIFT.get(arch, 0.0)
    return 0.0


def qk_heads(arch: str, name: str, config: dict) -> int | None:
    """Head count whose row permutation GGUF tensor `name` carries, or None if unpermuted."""
    if arch not in PERMUTED_QK_ARCHS:
        return None
    m = _BLOCK_RE.fullmatch(name)
    if not m:
        return None
    if m.group(2) in ("attn_q.weight", "attn_q.bias"):
        return config["num_attention_heads"]
    if m.group(2) in ("attn_k.weight", "attn_k.bias"):
        return config["num_key_value_heads"]
    return None


def unpermute_order(rows: int, n_head: int) -> np.ndarray:
    """Row indices that undo llama.cpp's LlamaModel.permute: hf_rows = gguf_rows[order].

    permute (HF -> GGUF): w.reshape(n_head, 2, hd // 2, ...).swapaxes(1, 2), so GGUF row
    (h, i, j) of the (n_head, hd // 2, 2) grid holds HF row (h, j, i) of (n_head, 2, hd // 2).
    Rows move whole, so the same order applies to float rows and to quantized byte rows.
    """
    if n_head <= 0 or rows % (2 * n_head):
        raise ValueError(f"{rows} rows cannot be split into {n_head} heads of even size")
    return np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)


class _Meta:
    """Typed access to GGUF metadata with one-line SourceErrors naming the file and key."""

    def __init__(self, meta: Mapping[str, Any], path: str, arch: str):
        self.meta, self.path, self.arch = meta, path, arch

    def key(self, key: str) -> str:
        return key.replace("{arch}", self.arch)

    def get(self, key: str, kind: type, default: Any = None, required: bool = False) -> Any:
        key = self.key(key)
        if key not in self.meta:
            if required:
                raise SourceError(f"{self.path}: metadata field {key} is missing")
            return default
        value = self.meta[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise SourceError(
                f"{self.path}: metadata field {key} is {value!r}, expected {kind.__name__}"
            )
        return value

    def positive(self, key: str, default: Any = None, required: bool = False) -> Any:
        value = self.get(key, int, default, required)
        if value is not None and value <= 0:
            raise SourceError(
                f"{self.path}: metadata field {self.key(key)} is {value}, expected > 0"
            )
        return value


def hf_config(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], path: str,
              rope_freqs: np.ndarray | None = None) -> dict:
    """config.json of the HF model stored in a GGUF file.

    meta: GGUF metadata (key -> Python value); shapes: GGUF tensor name -> HF-oriented shape;
    rope_freqs: the rope_freqs.weight tensor if the file has one (llama3 rope scaling).
    """
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise SourceError(f"{path}: metadata field general.architecture is missing")
    mtype = model_type(arch)
    m = _Meta(meta, path, arch)
    hidden = m.positive("{arch}.embedding_length", required=True)
    heads = m.positive("{arch}.attention.head_count", required=True)
    kv_heads = m.positive("{arch}.attention.head_count_kv", default=heads)
    head_dim = m.positive("{arch}.attention.key_length", default=hidden // heads)
    if heads % kv_heads:
        raise SourceError(f"{path}: {heads} attention heads are not a multiple of {kv_heads} "
                          "key/value heads")
    rope_dim = m.positive("{arch}.rope.dimension_count", default=head_dim)
    if rope_dim != head_dim:
        raise SourceError(f"{path}: {m.key('{arch}.rope.dimension_count')} is {rope_dim} but "
                          f"head_dim is {head_dim} (partial rotary embeddings are not supported)")
    if "token_embd.weight" not in shapes or len(shapes["token_embd.weight"]) != 2:
        raise SourceError(f"{path}: tensor token_embd.weight is missing or not 2-D")
    vocab, embd = shapes["token_embd.weight"]
    if embd != hidden:
        raise SourceError(f"{path}: token_embd.weight has width {embd}, "
                          f"{m.key('{arch}.embedding_length')} says {hidden}")
    theta = m.get("{arch}.rope.freq_base", float, 10000.0)
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch][1]],
        "model_type": mtype,
        "hidden_size": hidden,
        "intermediate_size": m.positive("{arch}.feed_forward_length", required=True),
        "num_hidden_layers": m.positive("{arch}.block_count", required=True),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": m.get("{arch}.attention.layer_norm_rms_epsilon", float, required=True),
        "max_position_embeddings": m.positive("{arch}.context_length", required=True),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in shapes,
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(m, theta, head_dim, rope_freqs),
    }
    # transformers >= 5 spells rope settings as one dict; give both spellings.
    config["rope_parameters"] = {"rope_theta": theta, "rope_type": "default",
                                 **(config["rope_scaling"] or {})}
    if mtype in ("llama", "mistral"):
        config["attention_bias"] = "blk.0.attn_q.bias" in shapes
        config["mlp_bias"] = False
    window = m.positive("{arch}.attention.sliding_window")
    if window is not None:
        config["sliding_window"] = window
    if mtype == "gemma3_text":
        config.update(_gemma3_config(m, config))
    for field, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id"), ("unk_token_id", "unknown_token_id")):
        value = m.get(f"tokenizer.ggml.{key}", int)
        if value is not None:
            config[field] = value
    return config


def _gemma3_config(m: _Meta, config: dict) -> dict:
    """Gemma 3 settings llama.cpp fixes in code rather than metadata: every 6th layer global
    (unless the file lists the pattern), RoPE base 10000 without scaling on sliding layers,
    queries scaled by head_dim**-0.5 (hidden / heads for the 62-layer 27B model)."""
    n = config["num_hidden_layers"]
    if "sliding_window" not in config:
        raise SourceError(f"{m.path}: metadata field {m.key('{arch}.attention.sliding_window')} "
                          "is missing")
    key = m.key("{arch}.attention.sliding_window_pattern")
    pattern = m.meta.get(key, 6)
    if isinstance(pattern, list) and len(pattern) == n and all(
            isinstance(p, (bool, int)) for p in pattern):
        sliding = [bool(p) for p in pattern]
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        sliding = [(i + 1) % pattern != 0 for i in range(n)]
    else:
        raise SourceError(f"{m.path}: metadata field {key} is {pattern!r}, expected a layer "
                          f"count or {n} booleans")
    full = {"rope_theta": config["rope_theta"], "rope_type": "default",
            **(config["rope_scaling"] or {})}  # rope scaling applies to global layers only
    scalar = config["hidden_size"] // config["num_attention_heads"] if n == 62 \
        else config["head_dim"]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_parameters": {"full_attention": full,
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": m.get("{arch}.attn_logit_softcapping", float),
        "final_logit_softcapping": m.get("{arch}.final_logit_softcapping", float),
        "attention_bias": False,
    }


def _rope_scaling(m: _Meta, theta: float, head_dim: int,
                  rope_freqs: np.ndarray | None) -> dict | None:
    """HF rope_scaling from {arch}.rope.scaling.* metadata or a llama3 rope_freqs tensor."""
    kind = m.get("{arch}.rope.scaling.type", str, "none")
    factor = m.get("{arch}.rope.scaling.factor", float)
    orig = m.positive("{arch}.rope.scaling.original_context_length")
    if kind == "linear" and factor is not None:
        scaling = {"rope_type": "linear", "factor": factor}
    elif kind == "yarn" and factor is not None:
        scaling = {"rope_type": "yarn", "factor": factor}
        if orig is not None:
            scaling["original_max_position_embeddings"] = orig
    elif kind in ("none", "linear", "yarn"):
        scaling = None
    else:
        raise SourceError(f"{m.path}: rope scaling type {kind!r} is not supported")
    if rope_freqs is not None:
        if scaling is not None:
            raise SourceError(f"{m.path}: both rope_freqs.weight and {kind} rope scaling")
        scaling = llama3_rope_scaling(np.asarray(rope_freqs, dtype=np.float64), theta,
                                      head_dim, orig, m.path)
    return scaling


def llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float,
                   orig: float) -> np.ndarray:
    """Per-frequency divisors of llama3 rope scaling (what llama.cpp stores as rope_freqs)."""
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = (orig / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, mid))


def llama3_rope_scaling(freqs: np.ndarray, theta: float, head_dim: int, orig: int | None,
                        path: str) -> dict | None:
    """llama3 rope_scaling parameters that reproduce llama.cpp's rope_freqs tensor.

    rope_freqs keeps only the per-frequency divisors, and (original_max_position_embeddings,
    low_freq_factor, high_freq_factor) are fixed by them only up to a common scale: every
    solution that reproduces the tensor gives the same model. We fit with low_freq_factor = 1,
    rescale to the file's original_context_length when it has one, and verify.
    """
    if freqs.shape != (head_dim // 2,) or not np.isfinite(freqs).all() or (freqs < 1 - 1e-6).any():
        raise SourceError(f"{path}: rope_freqs.weight (shape {list(freqs.shape)}) is not a "
                          f"llama3 rope factor vector for head_dim {head_dim}")
    factor = float(freqs.max())
    if factor <= 1 + 1e-6:
        return None
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ones = np.isclose(freqs, 1.0, rtol=1e-6, atol=0)
    full = np.isclose(freqs, factor, rtol=1e-6, atol=0)
    mid = ~ones & ~full
    if full.all():
        return {"rope_type": "linear", "factor": factor}
    # orig (= orig / low_freq_factor) lies between the mid and the fully scaled wavelengths.
    w_full = wavelen[full].min() if full.any() else 2 * wavelen.max()
    if mid.sum() >= 2:
        # 1/f = (1 - s)/factor + s, and s * (high - 1) = orig / wavelen - 1: linear in both.
        s = (1 / freqs[mid] - 1 / factor) / (1 - 1 / factor)
        a = np.stack([1 / wavelen[mid], -s], axis=1)
        orig_fit, high_m1 = np.linalg.lstsq(a, np.ones_like(s), rcond=None)[0]
        if abs(orig_fit - round(orig_fit)) < 1e-3 * orig_fit:
            orig_fit = round(orig_fit)
    else:
        # Underdetermined: any orig between the bounds works; take a round one.
        w_mid = wavelen[mid][0] if mid.any() else (wavelen[ones].max() if ones.any() else 0.0)
        orig_fit = math.sqrt(max(w_mid, 1e-9) * w_full)
        if w_mid < round(orig_fit) < w_full:
            orig_fit = round(orig_fit)
        if mid.any():
            s = (1 / freqs[mid][0] - 1 / factor) / (1 - 1 / factor)
            high_m1 = (orig_fit / w_mid - 1) / s
        else:
            high_m1 = (orig_fit / w_mid - 1) / 2 if w_mid else 1.0
    scale = orig / orig_fit if orig else 1.0
    params = {"rope_type": "llama3", "factor": factor,
              "low_freq_factor": round(float(scale), 6),
              "high_freq_factor": round(float((1 + high_m1) * scale), 6),
              "original_max_position_embeddings": orig or orig_fit}
    again = llama3_factors(theta, head_dim, factor, params["low_freq_factor"],
                           params["high_freq_factor"], params["original_max_position_embeddings"])
    if not (high_m1 > 0 and np.allclose(again, freqs, rtol=1e-5, atol=0)):
        raise SourceError(f"{path}: rope_freqs.weight does not match llama3 rope scaling")
    return params
