"""PEFT's LoRA files: adapter_config.json + adapter_model.safetensors -> an Adapter.

Read from adapter_config.json: peft_type LORA, r, lora_alpha, use_rslora, target_modules
(a list of module-name suffixes, or a regex the whole name must match), rank_pattern and
alpha_pattern (per-module r / alpha, matched as peft's get_pattern_key matches them),
layers_to_transform, fan_in_fan_out (it concerns the base layer's storage, Conv1D's
[in, out]; lora_A/lora_B are [r, in] / [out, r] either way, and every projection edgellm
runs is a Linear [out, in]). Tensors: "base_model.model.<module>.lora_A[.<adapter>].weight"
[r, K] and ".lora_B[.<adapter>].weight" [N, r], F32, F16 or BF16.

Refused, with a message saying so: DoRA (use_dora, lora_magnitude_vector), modules_to_save,
trainable tokens, LoRA biases (lora_bias), embedding and lm_head LoRA, other PEFT types.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from ..errors import AdapterError
from . import Adapter, LoraModule

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
_KEY = re.compile(r"(?P<module>.+)\.lora_(?P<ab>A|B)(?:\.(?P<adapter>[^.]+))?\.weight")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
NOT_LINEAR = ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out")
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_peft(root: Path) -> Adapter:
    cfg_path = root / CONFIG
    config = _read_config(cfg_path)
    r, alpha, rslora = _int(config, "r", cfg_path), _number(config, "lora_alpha", cfg_path), \
        _flag(config, "use_rslora", cfg_path)
    ranks = _patterns(config, "rank_pattern", cfg_path, rank=True)
    alphas = _patterns(config, "alpha_pattern", cfg_path)
    targets = _targets(config, cfg_path)
    layers = _layers(config, cfg_path)
    tensors = read_safetensors(root / WEIGHTS)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    adapter_names = set()
    for key, value in tensors.items():
        name = key[len(PREFIX):] if key.startswith(PREFIX) else key
        m = _KEY.fullmatch(name)
        if m is None:
            raise AdapterError(f"{root / WEIGHTS}: tensor {key} is not a LoRA A/B weight "
                               f"({_what(name)})")
        module = m.group("module")
        if module.split(".")[-1] in NOT_LINEAR:
            raise AdapterError(f"{root / WEIGHTS}: tensor {key}: LoRA on {module} (embedding "
                               "or output head) is not supported; only linear projections")
        adapter_names.add(m.group("adapter"))
        pairs.setdefault(module, {})[m.group("ab")] = value
    if len(adapter_names) > 1:
        raise AdapterError(f"{root / WEIGHTS}: holds several adapters "
                           f"({', '.join(sorted(str(a) for a in adapter_names))}); save one "
                           "per directory")
    if not pairs:
        raise AdapterError(f"{root / WEIGHTS}: no LoRA tensors")
    modules = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            missing = ({"A", "B"} - set(ab)).pop()
            raise AdapterError(f"{root / WEIGHTS}: {module} has no lora_{missing} weight")
        A, B = ab["A"], ab["B"]
        if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0]:
            raise AdapterError(f"{root / WEIGHTS}: {module}: lora_A {list(A.shape)} and "
                               f"lora_B {list(B.shape)} are not [r, in] and [out, r]")
        _check_target(targets, layers, module, cfg_path)
        rank = _pattern_key(ranks, module) or r
        a = _pattern_key(alphas, module)
        a = alpha if a is None else a
        if A.shape[0] != rank:
            raise AdapterError(f"{root / WEIGHTS}: {module}: lora_A has rank {A.shape[0]}, "
                               f"the config says r={rank}")
        scale = a / math.sqrt(rank) if rslora else a / rank
        modules[module] = LoraModule(module, A, B, float(scale))
    return Adapter(str(root), modules)


def _what(name: str) -> str:
    if "lora_magnitude_vector" in name:
        return "DoRA is not supported"
    if "lora_embedding" in name:
        return "embedding LoRA is not supported"
    if ".lora_B" in name and name.endswith(".bias"):
        return "LoRA biases (lora_bias) are not supported"
    if "modules_to_save" in name or "trainable_tokens" in name:
        return "modules_to_save / trainable tokens are not supported"
    return "edgellm reads lora_A/lora_B weights only"


def _read_config(path: Path) -> dict:
    if not path.exists():
        raise AdapterError(f"{path.parent}: no {CONFIG} (not a PEFT adapter directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterError(f"{path}: cannot read: {e}") from None
    except RecursionError:  # json's parser recurses once per nesting level
        raise AdapterError(f"{path}: JSON nested too deeply to be an adapter config") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: not a JSON object")
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise AdapterError(f"{path}: peft_type {kind!r} is not supported (LORA only)")
    refused = (("use_dora", "DoRA (use_dora) is not supported"),
               ("modules_to_save", "modules_to_save is not supported (its full copies of "
                                   "modules are not a low-rank delta)"),
               ("trainable_token_indices", "trainable tokens are not supported"),
               ("lora_bias", "LoRA biases (lora_bias) are not supported"),
               ("layer_replication", "layer_replication is not supported"))
    for field, message in refused:
        if config.get(field):
            raise AdapterError(f"{path}: {message}")
    return config


def _int(config: dict, field: str, where: Path) -> int:
    v = config.get(field)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise AdapterError(f"{where}: field {field!r} is {v!r}, expected an integer >= 1")
    return v


def _number(config: dict, field: str, where: Path) -> float:
    v = config.get(field)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise AdapterError(f"{where}: field {field!r} is {v!r}, expected a number")
    return float(v)


def _flag(config: dict, field: str, where: Path) -> bool:
    v = config.get(field)
    if v is not None and not isinstance(v, bool):
        raise AdapterError(f"{where}: field {field!r} is {v!r:.60}, expected true or false")
    return bool(v)


def _regex(pattern: str, field: str, where: Path) -> re.Pattern:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise AdapterError(f"{where}: field {field!r}: {pattern!r:.60} is not a valid "
                           f"regular expression ({e})") from None


def _patterns(config: dict, field: str, where: Path, rank: bool = False) -> dict:
    """rank_pattern / alpha_pattern: {regex: r} (ints >= 1) or {regex: alpha} (finite
    numbers), each key compiled as peft's get_pattern_key matches it."""
    v = config.get(field) or {}
    if not isinstance(v, dict):
        raise AdapterError(f"{where}: field {field!r} must map module patterns to "
                           f"{'ranks' if rank else 'numbers'}, got {type(v).__name__}")
    out = {}
    for key, x in v.items():
        ok = isinstance(x, int) and x >= 1 if rank else \
            isinstance(x, (int, float)) and math.isfinite(x)
        if isinstance(x, bool) or not ok:
            raise AdapterError(f"{where}: field {field!r}: {key!r:.60} maps to {x!r:.40}, "
                               f"expected {'an integer >= 1' if rank else 'a finite number'}")
        out[key] = (_regex(rf"(.*\.)?({key})$", field, where), x)
    return out


def _pattern_key(patterns: dict, module: str):
    """peft's get_pattern_key: the value of the first pattern matching the end of the
    module name (None if none does)."""
    for regex, value in patterns.values():
        if regex.match(module):
            return value
    return None


def _targets(config: dict, where: Path):
    """target_modules: a compiled regex the whole name must match, or a list of names."""
    targets = config.get("target_modules")
    if isinstance(targets, str):
        return _regex(targets, "target_modules", where)
    if isinstance(targets, list) and targets and all(isinstance(t, str) and t
                                                     for t in targets):
        return targets
    raise AdapterError(f"{where}: field 'target_modules' is {targets!r:.60}, expected a list "
                       "of module names or a regex")


def _layers(config: dict, where: Path) -> list[int] | None:
    """layers_to_transform: None, a layer index or a list of them."""
    layers = config.get("layers_to_transform")
    if layers is None:
        return None
    layers = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
    if not isinstance(layers, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
        raise AdapterError(f"{where}: field 'layers_to_transform' is "
                           f"{config.get('layers_to_transform')!r:.60}, expected a layer "
                           "index or a list of them")
    return layers


def _check_target(targets, layers, module: str, where: Path) -> None:
    """The module is one the config targets (peft's check_target_module_exists)."""
    if isinstance(targets, re.Pattern):
        ok = targets.fullmatch(module) is not None
    else:
        ok = any(module == t or module.endswith("." + t) for t in targets)
    if ok and layers is not None:
        m = _LAYER.search(module)
        ok = m is not None and int(m.group(1)) in layers
    if not ok:
        raise AdapterError(f"{where}: the adapter's weights for {module} are outside "
                           "target_modules / layers_to_transform")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (F32, F16, BF16)."""
    if not path.exists():
        bin_path = path.with_suffix(".bin")
        hint = (" (adapter_model.bin is a pickle edgellm does not read: save with "
                "safe_serialization=True)") if bin_path.exists() else ""
        raise AdapterError(f"{path}: missing{hint}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise AdapterError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        n = int.from_bytes(data[:8], "little")
        if len(data) < 8 or n > len(data) - 8:
            raise ValueError("header runs past the end of the file")
        header = json.loads(data[8:8 + n])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise AdapterError(f"{path}: not a safetensors file: {e}") from None
    except RecursionError:
        raise AdapterError(f"{path}: not a safetensors file: header nested too deeply") \
            from None
    base, out = 8 + n, {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = e["dtype"], [int(s) for s in e["shape"]], e["data_offsets"]
            lo, hi = int(lo), int(hi)
        except (KeyError, TypeError, ValueError):
            raise AdapterError(f"{path}: tensor {name}: malformed header entry") from None
        if dtype not in _DTYPES:
            raise AdapterError(f"{path}: tensor {name} has dtype {dtype} (F32, F16, BF16)")
        item = np.dtype(_DTYPES[dtype]).itemsize
        if any(s < 0 for s in shape) or not 0 <= lo <= hi <= len(data) - base \
                or hi - lo != item * math.prod(shape):
            raise AdapterError(f"{path}: tensor {name}: offsets do not fit the file")
        raw = np.frombuffer(data, _DTYPES[dtype], math.prod(shape), base + lo).reshape(shape)
        if dtype == "BF16":
            out[name] = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out[name] = raw.astype(np.float32)
        if not np.isfinite(out[name]).all():
            raise AdapterError(f"{path}: tensor {name} has NaN or infinite values")
    return out
