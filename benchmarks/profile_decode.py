"""Where a fused decode step's time goes, stage by stage, on one thread.

    python benchmarks/profile_decode.py MODEL [--pos 128] [--reps 30]

Each kind of matrix the step's program multiplies (q_proj, ..., the output head) runs
over all layers in one compiled loop (so weights stream from memory as in a real step),
then every matrix in the program's order; then the whole step at position 1 and at --pos
cached positions, for comparison: the step against its matrices shows what norms,
attention, barriers and calls cost.
Medians of --reps runs, milliseconds of this thread's CPU time per token (CPU time, not
wall time: the machine may be shared).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import edgellm  # noqa: E402
from edgellm.kernels.act_quant import quantize_rows  # noqa: E402
from edgellm.kernels.act_quant_k import ActK, quantize_k  # noqa: E402
from edgellm.step import decode_step as ds  # noqa: E402
from edgellm.step.ops import OPERANDS  # noqa: E402


@njit(cache=False, fastmath=True)
def _mv_list(blob, mats, idx, h, xq, xd, xs, xds, out, kinds, x16, sb, kq, kd, kb):
    """Matrices mats[idx[i]] in order, each times h (weights stream as in a step); kinds:
    the step's matrix types (its feats' first entries); x16: its feats' "x16"; sb[i]: the
    step reads matrix i on super-block activations (kq, kd, kb: ActK's), as _proj_row."""
    for i in range(idx.shape[0]):
        m = mats[idx[i]]
        rows = m[1]
        if sb[i]:
            ds._mv_sb(blob, m, 0, rows, kq[i:i + 1], kd[i:i + 1], kb[i:i + 1], out, 0, rows,
                      kinds, x16)
        else:
            ds._mv(blob, m, 0, rows, h[i:i + 1], xq[i:i + 1], xd[i:i + 1], xs[i:i + 1],
                   xds[i:i + 1], out, 0, rows, False, kinds, x16)


def group_name(tensor: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> self_attn.q_proj"""
    parts = tensor.removesuffix(".weight").split(".")
    if "layers" in parts:
        parts = parts[parts.index("layers") + 2:]
    return ".".join(parts)


def activations(K: int, n: int, rng, dtype=np.int8) -> tuple:
    """n random rows of width K and their integer blocks (dtype: int8 or int16, the step's
    activations): (h, xq, xd, xs, xds)."""
    h = rng.standard_normal((n, K)).astype(np.float32)
    xq = np.zeros((n, K), dtype)
    xd = np.zeros((n, K // 32), np.float32)
    xs = np.zeros((n, K // 32), np.int32)
    xds = np.zeros((n, K // 32), np.float32)
    quantize_rows(h, xq, xd, xs, xds, 0, n)
    return h, xq, xd, xs, xds


def timed(fn, reps: int) -> float:
    fn()
    out = []
    for _ in range(reps):
        t = time.thread_time()
        fn()
        out.append(time.thread_time() - t)
    return statistics.median(out) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pos", type=int, default=128, help="cached positions (128)")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    llm = edgellm.load(a.model, threads=1, context=max(512, a.pos + 8))
    m = llm.model
    f = m.fused
    if f is None:
        raise SystemExit("this model has no fused decode path")
    rng = np.random.default_rng(0)
    names = {i: name for (name,), i in f.program.mat_index.items()}
    order = [int(op[1]) for op in f.prog if op[0] == ds.PROJ]  # step order, repeats kept
    sb_of = {int(op[1]): int(op[1 + OPERANDS[ds.PROJ].index("sb")])
             for op in f.prog if op[0] == ds.PROJ}
    groups: dict[str, list[int]] = {}
    for i in order:
        groups.setdefault(group_name(names[i]), []).append(i)
    on = f.feats[:ds.N_KINDS]
    big = np.zeros((1, int(f.mats[:, ds.MAT_ROWS].max())), np.float32)

    def run(idx: list[int]):
        cols = [m.packed.tensors[names[i]].shape[1] for i in idx]
        K = max(cols)
        h, xq, xd, xs, xds = activations(K, len(idx), rng, f.xq.dtype)
        table = np.array(idx, np.int64)
        if len(set(cols)) > 1:  # rows of one width per call
            parts = [[j for j in idx if m.packed.tensors[names[j]].shape[1] == c]
                     for c in sorted(set(cols))]
            return sum(run(p) for p in parts)
        sb = np.array([sb_of[i] for i in idx], np.int64)
        k = ActK(len(idx), K if K % 256 == 0 else 256, f.xq.dtype)
        if K % 256 == 0:
            quantize_k(h, k)
        return timed(lambda: _mv_list(f.blob, f.mats, table, h, xq, xd, xs, xds, big, on,
                                      f.feats[ds.F_X16], sb, k.xq, k.xd, k.xb), a.reps)

    rows = {name: run(idx) for name, idx in groups.items()}
    total = sum(rows.values())
    in_order = run(order)

    m.reset()
    m.forward(rng.integers(0, m.args.vocab_size, a.pos), want="none")

    def step():
        m.cache.truncate(a.pos)
        del m.tokens[a.pos:]
        m.forward([1], want="last")

    step_ms = timed(step, a.reps)
    m.reset()
    m.forward([1], want="none")

    def step0():
        m.cache.truncate(1)
        del m.tokens[1:]
        m.forward([1], want="last")

    step0_ms = timed(step0, a.reps)
    print(f"{Path(a.model).name}: ms per token, 1 thread, {a.pos} cached positions")
    for k, v in rows.items():
        print(f"  {k:24s} {v:7.3f}")
    print(f"  {'sum':24s} {total:7.3f}  (each kind over all layers: partly cache-hot)")
    print(f"  every matrix in step order {in_order:7.3f}  (weights stream as in a step)")
    print(f"  step at pos 1        {step0_ms:7.3f}  (step - matrices in order: "
          f"{step0_ms - in_order:.3f})")
    print(f"  step at pos {a.pos:<8d} {step_ms:7.3f}  (attention growth: "
          f"{step_ms - step0_ms:.3f})")


if __name__ == "__main__":
    main()
