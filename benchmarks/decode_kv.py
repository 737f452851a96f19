"""Whole decode steps at long contexts, one thread, by KV cache type: CPU ms per token.

    python benchmarks/decode_kv.py MODEL [--pos 512 2048] [--types f32 f16] [--rounds 2]

The cache is filled with random rows (encoded as its kv_type stores them) at positions
0..pos-1 instead of a prefill of pos tokens (minutes at 1.7B on one thread): the step reads
the same bytes either way. Types alternate within each round, so load drifts reach all
alike. Medians of --reps steps, this thread's CPU time (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import numpy as np  # noqa: E402

import edgellm  # noqa: E402
from edgellm.cache.kv_cache import encode_rows  # noqa: E402


def fill(m, n: int, rng) -> None:
    """m's cache holding n random positions 0..n-1 (as after a prompt of n tokens)."""
    m.reset()
    c = m.cache
    for layer in c.layers:
        x = rng.standard_normal((2, n) + (layer.k.shape[1], c.layers[0].head_dim))
        layer.k[:n] = encode_rows(x[0].astype(np.float32), c.kv_type)
        layer.v[:n] = encode_rows(x[1].astype(np.float32), c.kv_type)
        layer.pos[:n] = np.arange(n)
        layer.written = n
    c.next_pos = c.n_tokens = n
    m.tokens[:] = list(rng.integers(0, m.args.vocab_size, n))


def step_ms(model: str, kv_type: str, n: int, reps: int) -> float:
    llm = edgellm.load(model, threads=1, context=n + 8, kv_type=kv_type)
    m = llm.model
    fill(m, n, np.random.default_rng(0))
    out = []
    for i in range(reps + 1):
        m.cache.truncate(n)
        del m.tokens[n:]
        t = time.thread_time()
        m.forward([1], want="last")
        if i:
            out.append(time.thread_time() - t)
    return statistics.median(out) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pos", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--types", nargs="+", default=["f32", "f16"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    for r in range(a.rounds):
        for n in a.pos:
            for kv in a.types:
                ms = step_ms(a.model, kv, n, a.reps)
                load = os.getloadavg()[0]
                print(f"round {r} pos {n:5d} {kv:5s} {ms:8.2f} ms/token  {1e3 / ms:6.2f} "
                      f"tok/s (CPU)  load {load:.1f}", flush=True)


if __name__ == "__main__":
    main()
