"""Arguments and model opening shared by the generating commands."""

from __future__ import annotations

import sys

from ..llm import LLM
from ..pull import resolve


def add_model_arguments(p) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="model file or catalog name (default: the default model)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="threads (default: all cores)")
    p.add_argument("--ctx", type=int, default=None,
                   help="context length in tokens (default: the model's, at most 4096)")
    p.add_argument("--precise", action="store_true",
                   help="float activations for quantized weights: matches the float model "
                        "where int8 rounding would flip a near-tie (slower)")


def add_sampling_arguments(p) -> None:
    p.add_argument("--temp", type=float, default=None, dest="temperature",
                   help="temperature; 0 = greedy (default: the model's generation_config)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repeat-penalty", type=float, default=None, dest="repetition_penalty")
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)


def sampling_kwargs(args) -> dict:
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "seed")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def open_model(args) -> LLM:
    """Resolve -m (pulling the default model on first use) and load it, saying when the
    kernels are being compiled (the first run on a machine)."""
    from ..kernels.warmup import compile_notice

    path = resolve(args.model, say=say)
    with compile_notice(say):
        llm = LLM(path, threads=args.threads, context=args.ctx, precise=args.precise)
        llm.model.warmup()
    return llm
