"""What a verify row costs: the batched step on n rows of one sequence (speculative/verify.py,
a cache's next n positions) against the single decode step, whole and cut down to one class
of op (barriers kept), at a given context; alternating, best round, CPU and wall time.

    python benchmarks/verify_profile.py [--model FILE] [--threads 1] [--context 600]
        [--rows 1 2 4 8] [--rounds 5] [--steps 10] [--kv-type f16]

A cut program computes garbage (its inputs are stale), but each op reads and writes what it
would in the whole step, so its time is that op class's share. "per row" is (x_n - x_1) /
(n - 1) over the single step's whole time: what each row past the first adds.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import edgellm
from edgellm.step import batch_step as bs
from edgellm.step import decode_step as ds
from edgellm.step.batched import BatchDecoder

DEFAULT_MODEL = Path.home() / ".cache" / "edgellm" / "models" / "smollm2-135m-instruct.edgellm"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kv-type", default="f16", choices=["f32", "f16", "q8_0"])
    args = ap.parse_args()
    R = max(args.rows)
    m = edgellm.load(args.model, threads=args.threads, context=args.context + 4 * R,
                     kv_type=args.kv_type).model
    if m.fused is None:
        raise SystemExit(f"{args.model}: no fused step, so no verify step")
    m.forward(np.random.default_rng(0).integers(0, m.args.vocab_size, args.context),
              want="none")
    st = BatchDecoder(m, [m.cache], interleave=("q4_0", "q4_1"), rows=R)
    st.step([0] * R, [5] * R)  # compile; the rows' tables: the next R positions
    m.take_back(R)
    prog = st.tables[0]
    op, V = prog[:, 0], m.args.vocab_size
    barrier = op == ds.BARRIER
    head = np.array([p[0] == ds.PROJ and p[3] == V for p in prog])
    cuts = {"whole step": np.ones(len(prog), bool), "  head": head,
            "  other PROJ": (op == ds.PROJ) & ~head, "  ATTEND": op == ds.ATTEND,
            "  the rest": ~((op == ds.PROJ) | (op == ds.ATTEND) | barrier)}
    kv = (st.k_bytes, st.v_bytes, st.pos, st.layers, st.cos, st.sin)
    slots = np.zeros(R, np.int64)

    def run(keep, n, steps):
        tables = (prog[keep | barrier],) + st.tables[1:]
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            st.schedulers[n].run(bs.batch_parallel, bs.batch_serial,
                                 (tables, st.bufs, kv, st.positions, slots, n, m.precise,
                                  bs.TILE, st.ilv, st.fused.feats))
        return ((time.process_time() - c0) / steps * 1000,
                (time.perf_counter() - t0) / steps * 1000)

    def single(steps):  # the decode step itself, a token run and taken back
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            m.forward(np.array([5], np.int64), want="last")
            m.take_back(1)
        return ((time.process_time() - c0) / steps * 1000,
                (time.perf_counter() - t0) / steps * 1000)

    for keep in cuts.values():
        for n in args.rows:
            run(keep, n, 1)
    single(2)
    best = {}
    load0 = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    for r in range(args.rounds):
        b = single(args.steps)
        best["single"] = tuple(min(x, y) for x, y in zip(best.get("single", (1e9, 1e9)), b))
        for name, keep in (cuts.items() if r % 2 == 0 else list(cuts.items())[::-1]):
            for n in args.rows:
                b = run(keep, n, args.steps)
                best[name, n] = tuple(min(x, y) for x, y in
                                      zip(best.get((name, n), (1e9, 1e9)), b))
    print(f"{args.threads} threads, context {args.context}, kv {args.kv_type}, ms per step "
          f"(CPU / wall), best of {args.rounds} rounds of {args.steps}; load "
          f"{load0} -> " + "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    one = best["single"]
    print(f"  decode step   {one[0]:6.3f} / {one[1]:6.3f}")
    n1 = min(args.rows)
    for name in cuts:
        cells = "  ".join(f"x{n} {best[name, n][0]:6.3f} / {best[name, n][1]:6.3f}"
                          for n in args.rows)
        line = f"  {name:12s} {cells}"
        if R > n1:
            per = [(best[name, R][k] - best[name, n1][k]) / (R - n1) / one[k] for k in (0, 1)]
            line += f"   per row {per[0]:.3f} / {per[1]:.3f} of a step"
        print(line)


if __name__ == "__main__":
    main()
