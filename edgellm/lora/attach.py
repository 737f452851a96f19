"""Adapters against a model: checked, then stacked into one low-rank pair per projection.

    projections(model)         weight name -> (N, K) of every Linear step the model runs
    check(adapter, model)      every module a projection of the model, every shape fitting
                               (AdapterError naming the first that is not)
    folded_gains(model)        weight name -> the norm gain folded into its columns
    stack(model, [(a, s)...])  weight name -> Delta: the adapters' pairs side by side

A Delta is what the per-operation path (arch/steps.py) and the fused decode step
(step/fused.py) add to a projection's output: out [T, N] += (x [T, K] @ A.T) @ BT, with
A [R, K] = [s1 scale1 A1; s2 scale2 A2; ...] and BT [R, N] = [B1 | B2 | ...]^T, R the sum
of the ranks: the cost grows with R, not with the base.

On a q8_0 file whose norms the converter folded into q/k/v and gate/up (W' = W diag(g),
the norm then multiplying by ones; converter/norm_fold.py), the adapter's A must still see
the normed input times g: A' = A diag(g), with g the gain the file keeps beside the folded
matrices (header quantization.folded_gains -> f32 [K] tensors). Files folded before the
gains were kept are refused, naming --no-fold-norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import AdapterError, FormatError
from . import Adapter


@dataclass(frozen=True, eq=False)
class Delta:
    """out += (x @ A.T) @ BT for one weight."""

    A: np.ndarray  # float32 [R, K], C-contiguous, scales folded in
    BT: np.ndarray  # float32 [R, N], C-contiguous

    @property
    def rank(self) -> int:
        return self.A.shape[0]


def projections(model) -> dict[str, tuple[int, int]]:
    """weight name -> (N, K) of every Linear step of the model's layers."""
    from ..arch.steps import Linear

    steps = getattr(model, "layer_steps", None)
    if steps is None:
        return {}
    return {s.w.name: tuple(s.w.shape) for layer in steps for s in layer
            if isinstance(s, Linear)}


def folded_gains(model) -> dict[str, np.ndarray]:
    """weight name -> float32 [K]: the norm gain the converter folded into that
    projection's columns (the header's quantization.folded_gains); FormatError naming the
    entry if a gain is missing, not an f32 vector of the projection's K, or not finite."""
    packed = model.packed
    table = (packed.header.get("quantization") or {}).get("folded_gains") or {}
    if not isinstance(table, dict):
        raise FormatError(f"{packed.path}: quantization.folded_gains is not a table")
    shapes = projections(model)
    out = {}
    for w, name in table.items():
        if w not in shapes or not isinstance(name, str) or name not in packed:
            raise FormatError(f"{packed.path}: quantization.folded_gains: {w} -> {name!r}: "
                              "no such projection or tensor")
        t = packed.tensor(name)
        g = t.data
        if t.type != "f32" or g.shape != (shapes[w][1],) or not np.all(np.isfinite(g)):
            raise FormatError(f"{packed.path}: tensor {name} ({t.type} {list(t.shape)}) is not "
                              f"the finite f32 gain of {shapes[w][1]} columns {w} needs")
        out[w] = g
    return out


def _folded(model) -> set[str]:
    """Projections whose columns a converter folded a norm's weight into (norm_fold.py)
    without keeping the gain (files from before folded_gains): their norm now applies a
    gain of all ones and the file says norms were folded."""
    from ..arch.steps import Linear, Norm

    quant = model.packed.header.get("quantization") or {}
    if not quant.get("norms_folded") or "folded_gains" in quant:
        return set()
    offset = getattr(model, "norm_offset", 0.0)  # a (1 + w) norm applies offset + w
    out = set()
    for layer in model.layer_steps:
        norms = {}
        for s in layer:
            if isinstance(s, Norm):
                norms[s.dst] = s.weight
            elif isinstance(s, Linear):
                w = norms.get(s.src)
                if w is not None and np.all(w + offset == 1.0):
                    out.add(s.w.name)
                for name in s.outputs:
                    norms.pop(name, None)
    return out


def check(adapter: Adapter, model) -> None:
    """AdapterError naming the first module the model lacks or whose shapes do not fit."""
    where = f"{adapter.path}"
    if getattr(model, "generates", True) is False or not hasattr(model, "layer_steps"):
        raise AdapterError(f"{where}: LoRA adapters apply to decoder models; "
                           f"{model.packed.path} is an encoder")
    shapes = projections(model)
    folded = _folded(model)
    for name, m in adapter.modules.items():
        w = m.weight
        if w not in shapes:
            what = ("is not a projection edgellm applies LoRA to" if w in model.packed
                    else "does not exist in the model")
            raise AdapterError(f"{where}: target module {name} {what} "
                               f"({model.packed.path}, {model.packed.architecture})")
        N, K = shapes[w]
        if m.A.shape[1] != K or m.B.shape[0] != N:
            raise AdapterError(f"{where}: {name}: lora_A {list(m.A.shape)} / lora_B "
                               f"{list(m.B.shape)} do not fit the weight [{N}, {K}]")
        if w in folded:
            raise AdapterError(f"{where}: {name}: {model.packed.path} was converted with "
                               "its norm weights folded into this projection; reconvert "
                               "with --no-fold-norms to apply LoRA at run time")


F16_MAX = float(np.finfo(np.float16).max)


def _in_range(adapter: Adapter, scale: float, name: str, A: np.ndarray, B: np.ndarray) -> None:
    """AdapterError naming the adapter and module when its scaled A or its B holds values
    beyond float16's range: the fused decode step stores them as float16 (they would be
    inf there), and no trained adapter comes near it (its output would overflow)."""
    for what, x in (("lora_A (scaled)", A), ("lora_B", B)):
        big = float(np.max(np.abs(x))) if x.size else 0.0
        if not big <= F16_MAX:
            at = f" at scale {scale:g}" if scale != 1.0 else ""
            raise AdapterError(f"{adapter.path}: {name}: {what} reaches {big:.3g}{at}, beyond "
                               f"the {F16_MAX:g} an adapter's weights may hold (the adapter "
                               "is corrupt or its scale too large)")


def stack(model, adapters: list[tuple[Adapter, float]]) -> dict[str, Delta]:
    """weight name -> Delta of `adapters` (each checked against `model` first)."""
    for adapter, _ in adapters:
        check(adapter, model)
    gains = folded_gains(model) if adapters else {}
    parts: dict[str, tuple[list, list]] = {}
    for adapter, scale in adapters:
        if scale == 0.0:
            continue
        for m in adapter.modules.values():
            a, b = parts.setdefault(m.weight, ([], []))
            with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                A = np.float32(m.scale * scale) * m.A
                g = gains.get(m.weight)
                A = A if g is None else A * g[None, :]  # A diag(g): the input lost g
            _in_range(adapter, scale, m.name, A, m.B)
            a.append(A)
            b.append(m.B.T)
    return {w: Delta(np.ascontiguousarray(np.concatenate(a), np.float32),
                     np.ascontiguousarray(np.concatenate(b), np.float32))
            for w, (a, b) in parts.items()}

