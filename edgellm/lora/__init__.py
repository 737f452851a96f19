"""LoRA adapters: y = W x + scale * B (A x), A and B in float beside the (quantized) W.

    Adapter           one adapter's modules, read from a PEFT directory (peft.py) or from
                      an edgellm adapter file (file.py, made by `convert-model --adapter`)
    LoraModule        one adapted projection: A float32 [r, K], B float32 [N, r], scale
                      (lora_alpha / r, or / sqrt(r) with rsLoRA)
    open_adapter(p)   a directory -> PEFT's files; a file -> an edgellm adapter file
    adapter_list(x)   load()'s `lora` argument -> [(path, scale), ...]
    parse_spec(s)     the command lines' DIR[:SCALE] -> (path, scale)

At run time (attach.py) every adapter is checked against the model (each module a
projection the model runs, each shape fitting) and the active adapters are stacked into
one low-rank pair per projection: A = [s1 A1; s2 A2] [R, K], B^T = [B1 | B2]^T [R, N],
so that two adapters cost their ranks' sum and nothing more. Merging into the weights
happens only at conversion from a float source (converter/lora_merge.py): merging into
quantized weights and re-quantizing rounds the low-rank delta away.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import AdapterError

__all__ = ["Adapter", "LoraModule", "open_adapter", "adapter_list", "parse_spec"]


@dataclass(frozen=True)
class LoraModule:
    """delta W [N, K] = scale * B @ A for module `name` ("model.layers.0.self_attn.q_proj")."""

    name: str
    A: np.ndarray  # float32 [r, K]
    B: np.ndarray  # float32 [N, r]
    scale: float

    @property
    def rank(self) -> int:
        return self.A.shape[0]

    @property
    def weight(self) -> str:
        """The name of the weight it adapts."""
        return self.name + ".weight"


@dataclass(frozen=True)
class Adapter:
    """One adapter: where it came from and its modules by name."""

    path: str
    modules: dict[str, LoraModule]

    @property
    def nbytes(self) -> int:
        return sum(m.A.nbytes + m.B.nbytes for m in self.modules.values())


def open_adapter(path: str | os.PathLike) -> Adapter:
    """A PEFT adapter directory or an edgellm adapter file (AdapterError if neither)."""
    p = Path(os.fspath(path))
    if p.is_dir():
        from .peft import read_peft

        return read_peft(p)
    if p.is_file():
        from .file import read_adapter_file

        return read_adapter_file(p)
    raise AdapterError(f"{p}: no such adapter (a PEFT directory with adapter_config.json, "
                       "or a file from convert-model --adapter)")


def parse_spec(text: str) -> tuple[str, float]:
    """DIR[:SCALE] -> (DIR, SCALE); a path containing ':' is taken whole when it exists."""
    if os.path.exists(text) or ":" not in text:
        return text, 1.0
    path, _, scale = text.rpartition(":")
    try:
        value = float(scale)
    except ValueError:
        raise AdapterError(f"--lora {text!r}: scale {scale!r} is not a number "
                           "(expected DIR[:SCALE])") from None
    return path, _scale(value, text)


def _scale(value, where) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not np.isfinite(value):
        raise AdapterError(f"LoRA scale of {where!s}: expected a finite number, got {value!r}")
    return float(value)


def adapter_list(lora) -> list[tuple[str, float]]:
    """load()'s `lora`: None, a path, or a list of paths and (path, scale) pairs."""
    if lora is None:
        return []
    if isinstance(lora, (str, os.PathLike)):
        return [(os.fspath(lora), 1.0)]
    if not isinstance(lora, (list, tuple)):
        raise AdapterError(f"lora must be a path or a list of paths / (path, scale) pairs, "
                           f"got {type(lora).__name__}")
    out = []
    for item in lora:
        if isinstance(item, (str, os.PathLike)):
            out.append((os.fspath(item), 1.0))
        elif isinstance(item, (list, tuple)) and len(item) == 2 \
                and isinstance(item[0], (str, os.PathLike)):
            out.append((os.fspath(item[0]), _scale(item[1], item[0])))
        else:
            raise AdapterError(f"lora entries must be paths or (path, scale) pairs, got "
                               f"{item!r}"[:200])
    return out
