"""Where the batched decode step's time goes: the step's program (step/fused.py) cut down to
one class of op (with the barriers kept), timed on 1, 2 and 4 rows; alternating, best round.

    python benchmarks/batch_profile.py --model EDGELLM_FILE [--threads 1] [--rounds 5]
        [--steps 10] [--context 200] [--kv-type f32] [--act-type int16]

A cut program computes garbage (its inputs are stale), but each op reads and writes what
it would in the whole step, so its time is that op class's share. What grows with the rows
is what keeps issue 24's 4 rows / 1 row ratio down: an op class whose x4 is 4x its x1
shares nothing between the rows.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import edgellm
from edgellm.arch import ACT_TYPES
from edgellm.step import batch_step as bs
from edgellm.step import decode_step as ds
from edgellm.step.batched import BatchDecoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--act-type", default="int16", choices=list(ACT_TYPES))
    ap.add_argument("--kv-type", default="f32", choices=["f32", "f16", "q8_0"])
    args = ap.parse_args()
    m = edgellm.load(args.model, threads=args.threads, context=1024, kv_type=args.kv_type,
                       act_type=args.act_type).model
    if m.fused is None:
        raise SystemExit(f"{args.model}: no fused step, so no batched step")
    m.forward(np.random.default_rng(0).integers(0, m.args.vocab_size, args.context),
              want="none")
    state = m.cache.state()
    caches = [m.new_cache() for _ in range(4)]
    st = BatchDecoder(m, caches)
    for c in caches:
        c.restore(state)
    st.step([0, 1, 2, 3], [5] * 4)  # compile, and the rows' tables filled in
    prog = st.tables[0]
    op, V = prog[:, 0], m.args.vocab_size
    barrier = op == ds.BARRIER
    head = np.array([p[0] == ds.PROJ and p[3] == V for p in prog])
    cuts = {"whole step": np.ones(len(prog), bool), "PROJ": op == ds.PROJ,
            "  head": head, "  layers": (op == ds.PROJ) & ~head, "ATTEND": op == ds.ATTEND,
            "QUANT": op == ds.QUANT,
            "NORM ACT ADD": (op == ds.NORM) | (op == ds.ACT) | (op == ds.ADD),
            "barriers": np.zeros(len(prog), bool)}
    kv = (st.k_bytes, st.v_bytes, st.pos, st.layers, st.cos, st.sin)
    rows = np.arange(4, dtype=np.int64)

    def run(keep, n, steps):
        tables = (prog[keep | barrier],) + st.tables[1:]
        t0 = time.perf_counter()
        for _ in range(steps):
            st.schedulers[n].run(bs.batch_parallel, bs.batch_serial,
                                 (tables, st.bufs, kv, st.positions, rows, n, m.precise,
                                  bs.TILE, st.ilv, st.fused.feats))
        return (time.perf_counter() - t0) / steps * 1000

    for keep in cuts.values():
        run(keep, 4, 1)
    best = {}
    load0 = "%.2f %.2f %.2f" % os.getloadavg()
    for r in range(args.rounds):
        for name, keep in (cuts.items() if r % 2 == 0 else list(cuts.items())[::-1]):
            for n in (1, 2, 4):
                best[name, n] = min(best.get((name, n), 1e9), run(keep, n, args.steps))
    print(f"{args.threads} threads, context {args.context}, ms per step, best of "
          f"{args.rounds} rounds of {args.steps}; load average {load0} -> "
          "%.2f %.2f %.2f" % os.getloadavg())
    for name in cuts:
        x = [best[name, n] for n in (1, 2, 4)]
        print(f"  {name:13s} x1 {x[0]:6.2f}  x2 {x[1]:6.2f}  x4 {x[2]:6.2f}  "
              f"(x4 / x1: {x[2] / x[0]:.2f})")


if __name__ == "__main__":
    main()
