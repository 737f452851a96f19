"""Fold RMSNorm weights into the 8-bit projections they feed.

A llama-family layer computes q = W_q (g * n(x)) with n(x) = x / rms(x) and g the norm's
weight; so does k, v from the same input, and gate, up from the second norm. The same
function is W_q diag(g) applied to n(x) with the norm's weight set to ones. Stored that
way, the int8 activations no longer carry g's large channels (SmolLM2's first layer: a
19x spread between a block's largest and median weight), and at 8 bits the weights
absorb the per-column scale for free. SmolLM2-135M, q8_0, perplexity on pydoc topics
against f32: +0.57% -> +0.29% (int8 activations), +0.27% -> +0.09% (precise).

Only where every projection a norm feeds is stored as q8_0 and requantized from float
values: at 4 bits the scaled columns cost more than they save (q4_0_mixed: 14.4 -> 18.0),
and a block copied losslessly from the source cannot be rescaled. Only architectures whose
norm is x / rms(x) * g, each feeding nothing else (the final norm feeds the output head,
which may be tied to the embedding: never folded). Calibrated quantization (column
weights or GPTQ moments measured on the unfolded model) turns it off.

The gain folded into the columns is kept beside them: "model.layers.{i}.{norm}.folded_gain"
(f32 [K], the vector the columns were multiplied by, i.e. the gain the norm applied: g for
x / rms(x) * g, it would be 1 + w for a Gemma-style norm), and the header's
quantization.folded_gains maps each folded projection to it (`gain_table`). A LoRA adapter
at run time reads the normed input x / rms(x) * g, so on a folded file its A becomes
A diag(g) (edgellm/lora/attach.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgellm.arch.llama import FOLDED_GAIN
from edgellm.errors import SourceError
from edgellm.modelfile import quant

from .source import SourceTensor

ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
TYPES = frozenset({"q8_0"})
# (norm, projections it feeds) per layer, Hugging Face names after "model.layers.{i}."
PAIRS = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
)

Planned = list[tuple[SourceTensor, str, str]]  # (source tensor, edgellm name, storage type)


def gain_name(i: int, norm: str) -> str:
    """The tensor keeping the gain of layer i's `norm` after it was folded."""
    return f"model.layers.{i}.{norm}.{FOLDED_GAIN}"


def fold_norms(planned: Planned, config: dict, block_size: int,
               types: frozenset[str] | None = None) -> tuple[Planned, int]:
    """`planned` with each foldable norm's weight loading as ones, its projections' columns
    scaled by it and its gain kept right after it (an f32 tensor, `gain_name`); returns
    (new plan, number of norms folded). types: the storage types that allow folding
    (default TYPES)."""
    types = TYPES if types is None else types
    if config.get("model_type") not in ARCHITECTURES:
        return planned, 0
    by_name = {name: (t, ty) for t, name, ty in planned}
    new: dict[str, SourceTensor] = {}
    gains: dict[str, SourceTensor] = {}  # norm weight name -> its kept gain
    folded = 0
    for i in range(int(config.get("num_hidden_layers") or 0)):
        for norm, projections in PAIRS:
            nname = f"model.layers.{i}.{norm}.weight"
            pnames = [f"model.layers.{i}.{p}.weight" for p in projections]
            if nname not in by_name or not all(p in by_name for p in pnames):
                continue
            nt, nty = by_name[nname]
            if nty != "f32" or len(nt.shape) != 1:
                continue
            if not all(_requantized(*by_name[p], block_size, types) for p in pnames):
                continue
            new[nname] = _ones(nt)
            gains[nname] = SourceTensor(gain_name(i, norm), nt.shape, "f32", nt.load)
            for p in pnames:
                new[p] = _scaled(by_name[p][0], nt.load)
            folded += 1
    out: Planned = []
    for t, name, ty in planned:
        out.append((new.get(name, t), name, ty))
        if name in gains:
            out.append((gains[name], gains[name].name, "f32"))
    return out, folded


def gain_table(planned: Planned, config: dict) -> dict[str, str]:
    """projection weight name -> the kept gain folded into its columns, for the header's
    quantization.folded_gains (from a plan fold_norms returned)."""
    names = {name for _, name, _ in planned}
    table = {}
    for i in range(int(config.get("num_hidden_layers") or 0)):
        for norm, projections in PAIRS:
            if gain_name(i, norm) in names:
                for p in projections:
                    table[f"model.layers.{i}.{p}.weight"] = gain_name(i, norm)
    return table


def _requantized(t: SourceTensor, ty: str, block_size: int, types: frozenset[str]) -> bool:
    raw_copy = t.load_raw is not None and t.dtype == ty and quant.TYPES[ty].is_ggml_block(block_size)
    return ty in types and not raw_copy and len(t.shape) == 2


def _ones(t: SourceTensor) -> SourceTensor:
    return SourceTensor(t.name, t.shape, t.dtype, lambda: np.ones(t.shape, np.float32))


def _scaled(t: SourceTensor, load_gain: Callable[[], np.ndarray]) -> SourceTensor:
    def load() -> np.ndarray:
        w = np.asarray(t.load(), dtype=np.float32)
        g = np.asarray(load_gain(), dtype=np.float32).reshape(-1)
        if w.ndim != 2 or g.shape[0] != w.shape[1]:
            raise SourceError(f"tensor {t.name}: {w.shape[-1]} columns, but the norm before it "
                              f"has {g.shape[0]} weights")
        return w * g[None, :]
    return SourceTensor(t.name, t.shape, t.dtype, load)
