"""`convert-model SRC OUT`: a Hugging Face directory or a GGUF file -> one packed file."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from edgellm import quant
from edgellm.errors import EdgeLLMError

from .recipes import DEFAULT_GGUF, DEFAULT_HF, RECIPES


def open_source(path: str):
    """A Source for a HF directory or a .gguf file."""
    p = Path(path)
    if p.is_dir():
        from .hf_source import open_hf

        return open_hf(p)
    if not p.exists():
        raise EdgeLLMError(f"{p}: no such file or directory")
    from .gguf_source import open_gguf

    return open_gguf(p)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="convert-model",
        description="Pack a Hugging Face model directory or a GGUF file into one "
                    "memory-mappable edgellm file.")
    ap.add_argument("src", help="Hugging Face model directory or .gguf file")
    ap.add_argument("out", help="output file (written atomically)")
    ap.add_argument("--quant", choices=RECIPES, default=None,
                    help=f"storage recipe (default: {DEFAULT_HF} for HF directories, "
                         f"{DEFAULT_GGUF} for GGUF: each tensor keeps its type)")
    ap.add_argument("--block-size", type=int, default=quant.DEFAULT_BLOCK,
                    choices=quant.BLOCK_SIZES, help="elements per quantization block")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    return ap


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    from .pack import convert

    try:
        source = open_source(args.src)
        recipe = args.quant or (DEFAULT_GGUF if source.kind == "gguf" else DEFAULT_HF)
        summary = convert(source, args.out, recipe, args.block_size, progress=not args.quiet)
    except KeyboardInterrupt:
        print("convert-model: interrupted; nothing written", file=sys.stderr)
        return 130
    except EdgeLLMError as e:
        print(f"convert-model: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print("\n".join(summary.lines()))
    return 0
