"""Decode tokens/s of the server's batched step (step/batched.py) with 1, 2 and 4 rows,
against the single fused step and the per-operation batched rows; runs alternating.

    python benchmarks/batch_decode.py --model EDGELLM_FILE [--threads 2] [--rounds 5]
        [--steps 16] [--context 200] [--act-type int16]

Each row's cache holds --context tokens of a prompt first. Per round and variant, --steps
steps from that state; tok/s = rows * steps / time, best round. Prints the ratios issue 24
asks of the server (4 rows / 1 row of the batched step; 4 rows / the single fused step)
and the load average.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import edgellm
from edgellm.arch import ACT_TYPES
from edgellm.batch import decode_rows
from edgellm.step.batched import BatchDecoder


class _View:
    def __init__(self, cache, index):
        self.cache, self.index, self.tokens = cache, index, []

    def make_room(self, n, shift):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--act-type", default="int16", choices=list(ACT_TYPES))
    ap.add_argument("--kv-type", default="f32")
    args = ap.parse_args()
    llm = edgellm.load(args.model, threads=args.threads, context=1024, kv_type=args.kv_type,
                       act_type=args.act_type)
    m = llm.model
    if m.fused is None:
        raise SystemExit(f"{args.model}: no fused step, so no batched step")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, m.args.vocab_size, args.context)
    m.forward(prompt, want="none")
    state = m.cache.state()
    caches = [m.new_cache() for _ in range(4)]
    stepper = BatchDecoder(m, caches)
    views = [_View(c, i) for i, c in enumerate(caches)]
    solo = m.cache

    def run(kind):
        for c in caches:
            c.restore(state)
        solo.restore(state)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            if kind == "fused":
                m.fused.step(5, m.precise)
            elif kind == "per-op x4":
                decode_rows(m, views, [5] * 4, [False] * 4)
            else:
                stepper.step(list(range(kind)), [5] * kind)
        return time.perf_counter() - t0

    kinds = ["fused", 1, 2, 4, "per-op x4"]
    for k in kinds:
        run(k)  # compile / warm
    best = {k: float("inf") for k in kinds}
    load0 = "%.2f %.2f %.2f" % os.getloadavg()
    for r in range(args.rounds):
        for k in kinds if r % 2 == 0 else kinds[::-1]:
            best[k] = min(best[k], run(k))
    rows = {"fused": 1, "per-op x4": 4}
    tok = {k: rows.get(k, k) * args.steps / t for k, t in best.items()}
    print(f"{args.threads} threads, context {args.context}, kv {args.kv_type}, best of {args.rounds} rounds of "
          f"{args.steps} steps; load average {load0} -> "
          "%.2f %.2f %.2f" % os.getloadavg())
    for k in kinds:
        label = f"batched x{k}" if isinstance(k, int) else k
        print(f"  {label:12s} {tok[k]:7.1f} tok/s  ({best[k] / args.steps * 1000:.2f} ms/step)")
    print(f"  batched 4 rows / 1 row: x{tok[4] / tok[1]:.2f}; 4 rows / the single fused step: "
          f"x{tok[4] / tok['fused']:.2f}; batched / per-op at 4 rows: "
          f"x{tok[4] / tok['per-op x4']:.2f}")


if __name__ == "__main__":
    main()
