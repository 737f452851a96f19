"""Size-targeted mixed precision: each matrix's type chosen so that the file meets a budget.

`convert-model --target-size 80MB` (or `--target-bpw 4.5`) stores every matrix the recipes
would block-quantize as one of the candidate types (default q4_0, q4_1, q8_0), chosen by
its measured sensitivity; vectors stay f32. The steps:

  1. cost: each candidate's bytes as the file lays them out (64-byte aligned); the header
     and the fixed tensors are counted exactly;
  2. error: e_t(type) = sum_ij c_j (W - Q(W))_ij^2, the expected squared error one token adds
     to the layer's output (c: calibration statistics, converter/calibrate.py); without
     calibration, the relative error sum (W - Q(W))^2 / sum W^2;
  3. sensitivity (with calibration): the matrices are grouped by kind and depth (q_proj of
     the first layer, of the first half, of the second half, of the last layer, ...), each
     group is run at the cheapest type inside the float model on the calibration text, and
     the KL divergence of its next-token distributions from the float model's measured:
     gain_g = KL_g / sum_{t in g} e_t(cheapest), and damage_t(type) = gain_g * e_t(type)
     (an estimate of the KL the tensor alone adds);
  4. allocation: every tensor starts at its cheapest type; upgrades along each tensor's
     lower convex hull of (bytes, damage) are taken in order of damage saved per byte
     while they fit (greedy on convex hulls: optimal for the relaxed problem).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgellm.errors import EdgeLLMError, QuantizationError
from edgellm.modelfile import format as fmt
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor

from .quantizers import weighted_error
from .recipes import TARGET_TYPES

DEFAULT_CANDIDATES = TARGET_TYPES
SENSITIVITY_TOKENS = 256  # calibration tokens each sensitivity measurement runs
HEADER_SLACK = 32  # bytes per tensor: the header's numbers change length with the types
ALIGN_SLACK = 64  # the tensors start on a 64-byte boundary after the stored tokenizer
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "k": 10**3,
          "m": 10**6, "g": 10**9, "t": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_LAYER = re.compile(r"^(.*\.layers\.)(\d+)(\..*)$")


def parse_size(text: str) -> int:
    """'80MB' -> 80_000_000; '80MiB' -> 80 * 2**20; '92037248' -> bytes (KB/MB/GB: powers
    of 1000, as convert-model's summary prints sizes; KiB/MiB/GiB: powers of 1024)."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise EdgeLLMError(f"cannot read size {text!r} (e.g. 80MB, 76.3MiB, 80000000)")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass
class Candidate:
    """One matrix that may take any candidate type."""

    name: str
    shape: tuple[int, ...]
    group: str
    cost: dict[str, int] = field(default_factory=dict)  # type -> bytes (aligned)
    error: dict[str, float] = field(default_factory=dict)  # type -> e_t(type)
    damage: dict[str, float] = field(default_factory=dict)  # type -> estimated KL


@dataclass
class TargetPlan:
    """The chosen types and what the choice is expected to cost."""

    types: dict[str, str]
    budget: int
    file_size: int  # upper bound of the file's size with these types
    smallest: int  # the smallest file the candidates allow
    damage: float  # estimated KL (nats per token) with calibration, else a relative error
    measured: bool  # whether sensitivities were measured on calibration text
    gains: dict[str, float] = field(default_factory=dict)  # group -> KL per unit of error
    kl: dict[str, float] = field(default_factory=dict)  # group -> measured KL at cheapest

    def lines(self) -> list[str]:
        counts = defaultdict(int)
        for ty in self.types.values():
            counts[ty] += 1
        what = (f"estimated KL {self.damage:.4f} nats/token" if self.measured
                else f"summed relative error {self.damage:.4g} (no calibration text: "
                     "sensitivity not measured)")
        return [f"target {self.budget / 1e6:.2f} MB: planned {self.file_size / 1e6:.2f} MB, "
                + ", ".join(f"{n} {t}" for t, n in sorted(counts.items())) + f"; {what}"]


def group_of(name: str, n_layers: int) -> str:
    """The sensitivity group of a tensor: its kind and depth (first, early, late, last)."""
    m = _LAYER.match(name)
    if m is None:
        return name
    i = int(m.group(2))
    kind = re.sub(r"\.\d+\.", ".*.", m.group(3))
    depth = ("first" if i == 0 else "last" if i == n_layers - 1 else
             "early" if i < n_layers / 2 else "late")
    return f"{m.group(1)}*{kind}@{depth}"


def plan(source, *, target_bytes: int | None = None, target_bpw: float | None = None,
         block_size: int = quant.DEFAULT_BLOCK, candidates=DEFAULT_CANDIDATES,
         quantize: Callable[..., np.ndarray], col_weights: dict | None = None,
         model=None, sens_ids: np.ndarray | None = None, meta_extra: dict | None = None,
         say: Callable[[str], None] = lambda m: None) -> TargetPlan:
    """Choose every matrix's type so that the file fits target_bytes (or the tensor data
    fits target_bpw bits per weight). `model`: the calibration FloatModel and `sens_ids`
    its tokens, to measure sensitivities; `quantize`: the block quantizer to measure with."""
    from .pack import _meta, _plan, stored_tokenizer

    candidates = tuple(dict.fromkeys(candidates))
    for ty in candidates:
        if ty not in quant.TYPES:
            raise QuantizationError(f"unknown candidate type {ty!r} (known: "
                                    f"{', '.join(quant.TYPES)})")
    if (target_bytes is None) == (target_bpw is None):
        raise EdgeLLMError("give one of target_bytes and target_bpw")
    n_layers = int(source.config.get("num_hidden_layers") or 0)
    planned = _plan(source, "q8_0", block_size)
    fixed: dict[str, str] = {}
    cands: list[tuple[object, Candidate]] = []
    params = 0
    for t, name, ty in planned:
        shape = tuple(int(s) for s in t.shape)
        params += int(np.prod(shape))
        if ty == "q8_0":
            cands.append((t, Candidate(name, shape, group_of(name, n_layers))))
        else:
            fixed[name] = ty
    for _, c in cands:
        c.cost = {ty: _cost(ty, c.shape, block_size) for ty in candidates}
    fixed_bytes = sum(_cost(ty, tuple(t.shape), block_size) for t, n, ty in planned
                      if n in fixed)
    if target_bytes is not None:
        infos = fmt.plan_tensors([(n, "q4_0" if n not in fixed else ty, tuple(t.shape),
                                   block_size) for t, n, ty in planned])
        header = fmt.encode_header(_meta(source, "target", block_size, meta_extra), infos)
        overhead = (fmt.align(fmt.PREAMBLE.size + len(header)) + HEADER_SLACK * len(planned)
                    + ALIGN_SLACK + len(stored_tokenizer(source)[1]))
        budget, limit = int(target_bytes), int(target_bytes) - overhead - fixed_bytes
    else:
        overhead = 0
        budget = int(target_bpw * params / 8)
        limit = budget - fixed_bytes
    cheapest = {c.name: min(c.cost, key=lambda ty: (c.cost[ty], ty)) for _, c in cands}
    smallest = sum(c.cost[cheapest[c.name]] for _, c in cands)
    if smallest > limit:
        total = smallest + fixed_bytes + overhead
        unit = (f"{total / 1e6:.2f} MB" if target_bytes is not None
                else f"{8 * (smallest + fixed_bytes) / params:.3f} bits per weight")
        raise EdgeLLMError(f"the target is too small: with types {', '.join(candidates)} the "
                           f"smallest file is {unit}")

    # errors of every candidate type (and the cheapest type's bytes, to measure with)
    cheap_data: dict[str, np.ndarray] = {}
    for i, (t, c) in enumerate(cands):
        say(f"measuring quantization error {i + 1}/{len(cands)}: {c.name}")
        values = t.load()
        cw = (col_weights or {}).get(c.name)
        norm = 1.0 if col_weights else max(float(np.square(values, dtype=np.float64).sum()),
                                           1e-30)
        for ty in candidates:
            data = quantize(values, ty, block_size, name=c.name)
            c.error[ty] = weighted_error(values, data, ty, block_size, cw) / norm
            if ty == cheapest[c.name] and model is not None:
                cheap_data[c.name] = data
    gains: dict[str, float] = {}
    kl: dict[str, float] = {}
    measured = model is not None and sens_ids is not None and col_weights is not None
    if measured:
        kl = _measure_kl(model, sens_ids, [c for _, c in cands], cheap_data, cheapest,
                         block_size, say)
        groups: dict[str, float] = defaultdict(float)
        for _, c in cands:
            groups[c.group] += c.error[cheapest[c.name]]
        gains = {g: kl[g] / e if e > 0 else 0.0 for g, e in groups.items()}
    for _, c in cands:
        g = gains.get(c.group, 1.0) if measured else 1.0
        c.damage = {ty: g * e for ty, e in c.error.items()}
    fold = not getattr(quantize, "calibrated", False)  # as pack.convert decides
    for _ in range(4):  # the gains a fold keeps depend on the types chosen: fit them too
        types = _allocate([c for _, c in cands], limit)
        data = sum(c.cost[types[c.name]] for _, c in cands)
        extra_bytes, extra_params = (_fold_extra(source, planned, types, block_size)
                                     if fold else (0, 0))
        if target_bytes is not None:
            over = overhead + fixed_bytes + data + extra_bytes - budget
        else:
            over = fixed_bytes + data + extra_bytes - int(target_bpw * (params + extra_params) / 8)
        if over <= 0:
            break
        limit -= over
    data += extra_bytes
    damage = sum(c.damage[types[c.name]] for _, c in cands)
    return TargetPlan(types={**fixed, **types}, budget=budget,
                      file_size=overhead + fixed_bytes + data,
                      smallest=overhead + fixed_bytes + smallest, damage=damage,
                      measured=measured, gains=gains, kl=kl)


def _fold_extra(source, planned, types: dict[str, str], block_size: int) -> tuple[int, int]:
    """(file bytes, values) that norm folding (norm_fold.py) adds with these types: each kept
    gain (f32, aligned), its tensor-table entry and the header's folded_gains table."""
    import json

    from . import norm_fold

    chosen = [(t, n, types.get(n, ty)) for t, n, ty in planned]
    folded, count = norm_fold.fold_norms(chosen, source.config, block_size)
    if not count:
        return 0, 0
    before = {n for _, n, _ in chosen}
    kept = [(t, n) for t, n, _ in folded if n not in before]
    table = len(json.dumps(norm_fold.gain_table(folded, source.config)))
    size = sum(_cost("f32", tuple(t.shape), block_size) + len(n) + 2 * HEADER_SLACK
               for t, n in kept)
    return size + table + HEADER_SLACK, sum(int(np.prod(t.shape)) for t, _ in kept)


def _cost(type_name: str, shape: tuple[int, ...], block_size: int) -> int:
    t = quant.qtype(type_name)
    return fmt.align(t.nbytes(shape, block_size if t.quantized else quant.DEFAULT_BLOCK))


def _kl(ref_logp: np.ndarray, logits: np.ndarray) -> float:
    """Mean over positions of KL(p_ref || p) in nats."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(np.mean(np.sum(np.exp(ref_logp) * (ref_logp - logp), axis=1)))


def _measure_kl(model, ids: np.ndarray, cands: list[Candidate], data: dict[str, np.ndarray],
                cheapest: dict[str, str], block_size: int, say) -> dict[str, float]:
    """{group: KL of the float model's next-token distributions with the group's matrices
    at their cheapest types}."""
    z = np.asarray(model.logits(ids), dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    ref_logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    groups: dict[str, list[Candidate]] = defaultdict(list)
    for c in cands:
        groups[c.group].append(c)
    kl = {}
    for i, (g, members) in enumerate(groups.items()):
        say(f"measuring sensitivity {i + 1}/{len(groups)}: {g}")
        replace = {c.name: Tensor(c.name, cheapest[c.name], c.shape, block_size, data[c.name])
                   for c in members}
        kl[g] = max(_kl(ref_logp, model.logits(ids, replace)), 0.0)
    return kl


def _allocate(cands: list[Candidate], limit: int) -> dict[str, str]:
    """Types within `limit` bytes: cheapest first, then hull upgrades by damage per byte."""
    choice, steps = {}, []
    for c in cands:
        hull = _hull([(c.cost[ty], c.damage[ty], ty) for ty in c.cost])
        choice[c.name] = hull[0][2]
        for k, ((b0, d0, _), (b1, d1, ty)) in enumerate(zip(hull, hull[1:])):
            steps.append(((d0 - d1) / (b1 - b0), c.name, k, b1 - b0, ty))
    used = sum(c.cost[choice[c.name]] for c in cands)
    done = defaultdict(int)  # steps taken per tensor: a tensor's steps go in order
    blocked = set()
    for _, name, k, extra, ty in sorted(steps, key=lambda s: (-s[0], s[1], s[2])):
        if name in blocked or k != done[name]:
            continue
        if used + extra > limit:
            blocked.add(name)
            continue
        used += extra
        choice[name] = ty
        done[name] += 1
    # fill what is left with any upgrade that fits (off-hull ones included), best first
    by_name = {c.name: c for c in cands}
    for _, name, ty in sorted(
            ((c.damage[choice[c.name]] - c.damage[ty]) / (c.cost[ty] - c.cost[choice[c.name]]),
             c.name, ty) for c in cands for ty in c.cost
            if c.cost[ty] > c.cost[choice[c.name]] and c.damage[ty] < c.damage[choice[c.name]]):
        c = by_name[name]
        extra = c.cost[ty] - c.cost[choice[name]]
        if 0 < extra <= limit - used and c.damage[ty] < c.damage[choice[name]]:
            used += extra
            choice[name] = ty
    return choice


def _hull(points: list[tuple[int, float, str]]) -> list[tuple[int, float, str]]:
    """The lower convex hull of (bytes, damage, type), from the cheapest point, keeping only
    points that lower the damage."""
    pts = sorted(points, key=lambda p: (p[0], p[1]))
    best: list[tuple[int, float, str]] = []
    for p in pts:
        if best and p[0] == best[-1][0]:
            continue  # same cost, higher (or equal) damage
        if best and p[1] >= best[-1][1]:
            continue  # costs more, saves nothing
        while len(best) >= 2:
            (b0, d0, _), (b1, d1, _) = best[-2], best[-1]
            # drop best[-1] if it lies on or above the segment best[-2] -> p
            if (d1 - d0) * (p[0] - b0) >= (p[1] - d0) * (b1 - b0):
                best.pop()
            else:
                break
        best.append(p)
    return best
