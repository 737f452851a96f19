"""Show a model file's architecture, tensors, size and memory plan.

Checks the header at every open; --verify also checks every tensor's checksum.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np

from ..cache.kv_types import DEFAULT_KV_TYPE, KV_TYPES
from ..errors import EdgeLLMError, FormatError
from ..memory_plan import default_context, largest_context, plan
from ..modelfile import layout as layouts
from ..modelfile import quant
from ..modelfile.format import PackedModel
from ..validate import check_model
from .common import MIN_CONTEXT


def add_arguments(p) -> None:
    p.add_argument("model", help="packed model file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verify", action="store_true", help="check every tensor's checksum")
    p.add_argument("--ctx", default=None, type=_ctx_text,
                   help="context for the memory plan (default: the one generate uses, the "
                        "model's up to 4096), or 'auto': the largest that fits the budget")
    p.add_argument("--max-memory", default=None, type=_size_text,
                   help="memory budget (e.g. 512MB, 1GB): without --ctx, plan the largest "
                        "context that fits it (default for --ctx auto: the memory this "
                        "machine has available now)")
    p.add_argument("--kv-type", choices=KV_TYPES, default=DEFAULT_KV_TYPE,
                   help=f"KV cache type for the memory plan (default: {DEFAULT_KV_TYPE})")


def parse_size(text: str) -> int:
    """'512MB', '1.5GB', '800M', '1T' -> bytes (powers of 1024)."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    try:
        size = int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):
        size = -1
    if size < 0:
        raise FormatError(f"cannot read size {text!r} (e.g. 512MB)")
    return size


def _ctx_text(text: str) -> str:
    """--ctx: 'auto' or a positive number of tokens (argparse: a usage error otherwise)."""
    if text != "auto" and not (text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of tokens or 'auto', "
                                         f"not {text!r}")
    return text


def _size_text(text: str) -> str:
    try:
        parse_size(text)
    except FormatError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def available_memory() -> int:
    """Bytes this machine has available now (MemAvailable; 512 MiB where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 512 * 2**20


def _memory(packed: PackedModel, args, ctx_arg: str | None, max_memory: str | None,
            kv_type: str = DEFAULT_KV_TYPE) -> dict:
    """The memory plan for --ctx / --max-memory, with the budget and whether it fits."""
    budget = parse_size(max_memory) if max_memory is not None else None
    if ctx_arg == "auto" or (ctx_arg is None and budget is not None):
        if budget is None:
            budget = available_memory()
        ctx = largest_context(packed, args, budget, kv_type)
        if ctx == 0:
            least = min(256, args.max_position_embeddings)
            need = plan(packed, args, least, kv_type).total
            raise EdgeLLMError(f"{packed.path}: does not fit in {_mb(budget)} even at a "
                               f"context of {least} tokens (needs {_mb(need)})")
    elif ctx_arg is None:
        ctx = default_context(args)
    else:
        try:
            ctx = int(ctx_arg)
        except ValueError:
            raise FormatError(f"--ctx must be a number or 'auto', not {ctx_arg!r}") from None
        limit = args.max_position_embeddings  # as generate refuses it: a plan for a context
        if not MIN_CONTEXT <= ctx <= limit:   # no command would run is no answer
            raise EdgeLLMError(f"--ctx {ctx}: the model takes {MIN_CONTEXT} to {limit} "
                               "tokens (max_position_embeddings)")
    memory = plan(packed, args, ctx, kv_type).to_json()
    if budget is not None:
        memory["budget"] = budget
        memory["fits"] = memory["total"] <= budget
    return memory


def describe(packed: PackedModel, ctx_arg: str | None, max_memory: str | None,
             kv_type: str = DEFAULT_KV_TYPE) -> dict:
    args = check_model(packed)  # the config and every tensor's shape, as loading checks them
    params = sum(int(np.prod(t.shape)) for t in packed.tensors.values())
    data = sum(t.nbytes for t in packed.tensors.values())
    by_type = Counter(t.type for t in packed.tensors.values())
    memory = _memory(packed, args, ctx_arg, max_memory, kv_type)
    return {
        "path": str(packed.path),
        "architecture": packed.architecture,
        "config": packed.config,
        "parameters": params,
        "file_size": packed.file_size,
        "bits_per_weight": 8 * data / max(params, 1),
        "quantization": packed.header.get("quantization", {}),
        "tensors_by_type": dict(by_type),
        "types": {ty: _type_info(packed, ty) for ty in by_type},
        "format_version": packed.version,
        "x16_tensors": sum(1 for t in packed.tensors.values() if t.layout == layouts.X16),
        "tensors": {n: {"type": t.type, "shape": list(t.shape), "block_size": t.block_size,
                        "layout": t.layout or "rows"}
                    for n, t in packed.tensors.items()},
        "memory": memory,
    }


def _x16_candidates(packed: PackedModel) -> int:
    """Matrices in rows that convert-model would store in x16 (modelfile/layout.py)."""
    return sum(1 for t in packed.tensors.values()
               if not t.layout and layouts.fits_x16(t.type, t.shape, t.block_size))


def _type_info(packed: PackedModel, type_name: str) -> dict:
    """A stored type's row of quant.TYPES, with its block sizes and bits per weight here."""
    t = quant.TYPES[type_name]
    mine = [x for x in packed.tensors.values() if x.type == type_name]
    params = sum(int(np.prod(x.shape)) for x in mine)
    info = {"layout": t.layout, "ggml": t.ggml,
            "bits_per_weight": 8 * sum(x.nbytes for x in mine) / max(params, 1)}
    if t.quantized:
        info["block_sizes"] = sorted({x.block_size for x in mine})
    return info


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**17 else f"{n} bytes"  # not '0.0 MiB' for 1KB


def run(args) -> int:
    with PackedModel(args.model) as packed:
        info = describe(packed, args.ctx, args.max_memory, args.kv_type)
        bad = packed.verify() if args.verify else []
    if args.verify:
        info["verified"] = not bad
        info["corrupt_tensors"] = bad
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        c, m = info["config"], info["memory"]
        print(f"{info['path']}: {info['architecture']}, {info['parameters'] / 1e6:.1f}M "
              f"parameters, {info['file_size'] / 1e6:.1f} MB, "
              f"{info['bits_per_weight']:.2f} bits per weight")
        print(f"  layers {c.get('num_hidden_layers')}, hidden {c.get('hidden_size')}, heads "
              f"{c.get('num_attention_heads')}/{c.get('num_key_value_heads')}, "
              f"vocab {c.get('vocab_size')}")
        print("  tensors: " + ", ".join(f"{n} {t}" for t, n in info["tensors_by_type"].items()))
        x16, fits = info["x16_tensors"], _x16_candidates(packed)
        print(f"  format version {info['format_version']}, " + (
            f"{x16} matrices in the x16 layout" if x16 else "every matrix in rows" + (
                f" ({fits} would read faster in the x16 layout: convert the model again)"
                if fits else "")))
        for name, t in info["types"].items():
            blocks = f", blocks of {'/'.join(map(str, t['block_sizes']))}" \
                if "block_sizes" in t else ""
            print(f"    {name}: {t['layout']}{blocks}, {t['bits_per_weight']:.2f} bits per "
                  f"weight")
        print(f"  memory at context {m['context']} (peak resident): {_mb(m['total'])} = weights "
              f"{_mb(m['weights'])}"
              f" (mapped) + KV cache {_mb(m['kv_cache'])} ({m['kv_type']}) + buffers {_mb(m['buffers'])} + "
              f"tokenizer {_mb(m['tokenizer'])} + runtime {_mb(m['baseline'])}")
        if "budget" in m:
            print(f"  {'fits in' if m['fits'] else 'does NOT fit in'} the budget of "
                  f"{_mb(m['budget'])}")
        if m["kv_cache"] != m["kv_cache_no_window"]:
            print(f"  KV cache without sliding windows would be {_mb(m['kv_cache_no_window'])}")
        if args.verify:
            print("  checksums: " + ("all tensors ok" if not bad else f"CORRUPT: {', '.join(bad)}"))
    return 1 if bad else 0
