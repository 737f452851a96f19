"""Measure a model's perplexity on a text file, as llama.cpp's perplexity tool does.

The text is tokenized whole and cut into chunks of --ctx tokens; each chunk runs from an
empty cache, with BOS as its first token when the tokenizer starts texts with BOS (--bos),
and only the second half of each chunk is scored. Prints the perplexity and its standard
error; --json prints {"ppl", "ppl_stderr", "tokens", "chunks", "ctx"} (tokens: scored).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import EdgeLLMError
from ..perplexity import BOS_MODES, perplexity
from .common import add_act_type_argument, add_kv_type_argument, add_lora_argument, open_model


def add_arguments(p) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="model file or catalog name (default: the default model)")
    p.add_argument("-f", "--file", required=True, help="text file ('-' reads stdin)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (default: 512)")
    p.add_argument("--chunks", type=int, default=None,
                   help="score at most this many chunks (default: all the text holds)")
    p.add_argument("--bos", choices=BOS_MODES, default="auto",
                   help="BOS as each chunk's first token: auto (when the tokenizer adds BOS "
                        "to a text, as llama.cpp), always, never")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="threads (default: all cores)")
    p.add_argument("--precise", action="store_true",
                   help="float activations for quantized weights (slower)")
    add_act_type_argument(p)
    add_kv_type_argument(p)
    add_lora_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise EdgeLLMError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise EdgeLLMError(f"{path}: not UTF-8 text") from None


def run(args) -> int:
    if args.ctx < 8:
        raise EdgeLLMError(f"--ctx must be at least 8, got {args.ctx}")
    if args.chunks is not None and args.chunks < 1:
        raise EdgeLLMError(f"--chunks must be at least 1, got {args.chunks}")
    text = read_text(args.file)

    def progress(i: int, n: int, ppl: float) -> None:
        if not args.json:
            print(f"[{i}/{n}] {ppl:.4f}", file=sys.stderr, flush=True)

    with open_model(args) as llm:
        result = perplexity(llm, text, ctx=args.ctx, chunks=args.chunks, bos=args.bos,
                            progress=progress)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(f"{result.line()}")
    return 0
