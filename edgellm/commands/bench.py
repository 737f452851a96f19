"""Measure prefill and decode speed, time to first token and peak memory (like llama-bench).

Each repetition starts from an empty cache: a prompt of -p random tokens is prefilled
(pp tokens/s), then -n tokens are decoded one at a time (tg tokens/s). Medians are shown.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

import numpy as np

from .common import add_lora_argument, add_model_arguments, open_model


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_lora_argument(p)
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens (128)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="generated tokens (64)")
    p.add_argument("-r", "--reps", type=int, default=5, help="repetitions (5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MiB (VmHWM: unlike ru_maxrss it does
    not carry over a parent's peak through exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(llm, n_prompt: int, n_gen: int, seed: int) -> tuple[float, float, float]:
    """(prefill tok/s, decode tok/s, time to first token in s) of one repetition."""
    m = llm.model
    vocab = llm.args.vocab_size
    prompt = np.random.default_rng(seed).integers(0, vocab, n_prompt)
    m.reset()
    t0 = time.perf_counter()
    logits = m.forward(prompt, want="last")
    token = int(np.argmax(logits))
    t1 = time.perf_counter()
    for _ in range(n_gen):
        token = int(np.argmax(m.forward([token], want="last")))
    t2 = time.perf_counter()
    return n_prompt / (t1 - t0), n_gen / (t2 - t1) if n_gen else 0.0, t1 - t0


def run(args) -> int:
    if args.n_prompt < 1 or args.n_gen < 0 or args.reps < 1:
        print("edgellm bench: -p must be >= 1, -n >= 0, -r >= 1", file=sys.stderr)
        return 2
    with open_model(args) as llm:
        if args.n_prompt + args.n_gen > llm.context:
            print(f"edgellm bench: -p + -n exceeds the context ({llm.context})", file=sys.stderr)
            return 2
        measure(llm, min(args.n_prompt, 8), min(args.n_gen, 2), seed=0)  # warm-up
        runs = [measure(llm, args.n_prompt, args.n_gen, seed=r + 1) for r in range(args.reps)]
        result = {
            "model": str(llm.packed.path),
            "threads": llm.threads,
            "precise": llm.precise,
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "reps": args.reps,
            "pp_tok_s": statistics.median(r[0] for r in runs),
            "tg_tok_s": statistics.median(r[1] for r in runs),
            "ttft_s": statistics.median(r[2] for r in runs),
            "peak_rss_mb": peak_rss_mb(),
            "file_mb": llm.packed.file_size / 2**20,
        }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['model']}: threads {result['threads']}"
              f"{' precise' if result['precise'] else ''}, median of {args.reps}")
        print(f"  pp{args.n_prompt}: {result['pp_tok_s']:8.1f} tok/s   "
              f"tg{args.n_gen}: {result['tg_tok_s']:8.1f} tok/s   "
              f"first token {result['ttft_s'] * 1000:.0f} ms   "
              f"peak RSS {result['peak_rss_mb']:.0f} MiB")
    return 0
