"""Show a model file's architecture, tensors, size and memory plan.

Checks the header at every open; --verify also checks every tensor's checksum.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np

from ..errors import FormatError
from ..format import PackedModel
from ..memory_plan import largest_context, plan
from ..validate import check_model


def add_arguments(p) -> None:
    p.add_argument("model", help="packed model file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verify", action="store_true", help="check every tensor's checksum")
    p.add_argument("--ctx", default="2048", type=_ctx_text,
                   help="context for the memory plan, or 'auto' with --max-memory")
    p.add_argument("--max-memory", default="512MB", type=_size_text,
                   help="memory budget for --ctx auto (e.g. 512MB, 1GB)")


def parse_size(text: str) -> int:
    """'512MB', '1.5GB', '800M' -> bytes (powers of 1024)."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
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


def describe(packed: PackedModel, ctx_arg: str, max_memory: str) -> dict:
    args = check_model(packed)  # the config and every tensor's shape, as loading checks them
    params = sum(int(np.prod(t.shape)) for t in packed.tensors.values())
    data = sum(t.nbytes for t in packed.tensors.values())
    by_type = Counter(t.type for t in packed.tensors.values())
    if ctx_arg == "auto":
        ctx = largest_context(packed, args, parse_size(max_memory))
    else:
        try:
            ctx = int(ctx_arg)
        except ValueError:
            raise FormatError(f"--ctx must be a number or 'auto', not {ctx_arg!r}") from None
    return {
        "path": str(packed.path),
        "architecture": packed.architecture,
        "config": packed.config,
        "parameters": params,
        "file_size": packed.file_size,
        "bits_per_weight": 8 * data / max(params, 1),
        "quantization": packed.header.get("quantization", {}),
        "tensors_by_type": dict(by_type),
        "tensors": {n: {"type": t.type, "shape": list(t.shape), "block_size": t.block_size}
                    for n, t in packed.tensors.items()},
        "memory": plan(packed, args, ctx).to_json(),
    }


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def run(args) -> int:
    with PackedModel(args.model) as packed:
        info = describe(packed, args.ctx, args.max_memory)
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
        print(f"  memory at context {m['context']}: {_mb(m['total'])} = weights {_mb(m['weights'])}"
              f" (mapped) + KV cache {_mb(m['kv_cache'])} + buffers {_mb(m['buffers'])} + "
              f"runtime {_mb(m['baseline'])}")
        if m["kv_cache"] != m["kv_cache_no_window"]:
            print(f"  KV cache without sliding windows would be {_mb(m['kv_cache_no_window'])}")
        if args.verify:
            print("  checksums: " + ("all tensors ok" if not bad else f"CORRUPT: {', '.join(bad)}"))
    return 1 if bad else 0
