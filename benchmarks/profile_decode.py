"""Where a fused decode step's time goes, stage by stage, on one thread.

    python benchmarks/profile_decode.py MODEL [--pos 128] [--reps 30]

Each stage runs over all layers in one compiled loop (so weights stream from memory as in
a real step): the 7 matrix-vector products per layer separately, the output head, the
attention of every query head at --pos cached positions, norms and activation
quantization. Then the whole step (decode_serial) at the same position, for comparison:
the stages' sum against the step shows what barriers, calls and cache effects cost.
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
from edgellm.kernels import decode_step as ds  # noqa: E402
from edgellm.kernels.act_quant import quantize_rows  # noqa: E402

NAMES = ("q", "k", "v", "o", "gate", "up", "down")


@njit(cache=False, fastmath=True)
def _mv_all(blob, mats, j, h, xq, xd, xds, out):
    for layer in range(mats.shape[0]):
        m = mats[layer, j]
        ds._mv(blob, m, h, xq, xd, xds, out, 0, m[1], False)


@njit(cache=False, fastmath=True)
def _mv_step_order(blob, mats, head, ha, fa, out):
    """Every matrix of the step in its order (weights stream as in a real step)."""
    for layer in range(mats.shape[0]):
        for j in range(7):
            m = mats[layer, j]
            a = fa if j == 6 else ha
            ds._mv(blob, m, a[0], a[1], a[2], a[3], out, 0, m[1], False)
    ds._mv(blob, head, ha[0], ha[1], ha[2], ha[3], out, 0, head[1], False)


@njit(cache=False, fastmath=True)
def _head(blob, head, h, xq, xd, xds, out):
    ds._mv(blob, head, h, xq, xd, xds, out, 0, head[1], False)


@njit(cache=False, fastmath=True)
def _norms_quant(x, norms, eps, h, aq, ad, asum, ads):
    for layer in range(norms.shape[0]):
        for j in range(2):
            ds._rmsnorm(x, norms[layer, j], eps, 0.0, h)
            quantize_rows(h, aq, ad, asum, ads, 0, 1)


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
    m.reset()
    m.forward(rng.integers(0, m.args.vocab_size, a.pos), want="none")
    D = m.args.hidden_size
    x = rng.standard_normal((1, D)).astype(np.float32)
    aq, ad, asum, ads = (v[0:1] for v in f.acts[0])
    quantize_rows(x, aq, ad, asum, ads, 0, 1)
    rows = {}
    total = 0.0
    for j, name in enumerate(NAMES):
        n_in = {"o": f.attn.shape[1], "down": f.ffn.shape[1]}.get(name, D)
        acts = f.acts[{"o": 1, "down": 2}.get(name, 0)]
        xin = rng.standard_normal((1, n_in)).astype(np.float32)
        quantize_rows(xin, *(v[0:1] for v in acts), 0, 1)
        out = np.zeros((1, int(f.mats[0, j, 1])), np.float32)
        bq, bd, _, bds = (v[0:1] for v in acts)
        rows[name] = timed(lambda j=j, bq=bq, bd=bd, bds=bds, out=out, xin=xin:
                           _mv_all(f.blob, f.mats, j, xin, bq, bd, bds, out), a.reps)
        total += rows[name]
    rows["head"] = timed(lambda: _head(f.blob, f.head, x, aq, ad, ads, f.logits), a.reps)
    total += rows["head"]
    big = np.zeros((1, max(int(f.mats[0, :, 1].max()), int(f.head[1]))), np.float32)
    ha = (x, aq, ad, ads)
    ffn_x = rng.standard_normal((1, f.ffn.shape[1])).astype(np.float32)
    fq, fd, fs, fds = (v[0:1] for v in f.acts[2])
    quantize_rows(ffn_x, fq, fd, fs, fds, 0, 1)
    in_order = timed(lambda: _mv_step_order(f.blob, f.mats, f.head, ha,
                                                         (ffn_x, fq, fd, fds), big), a.reps)
    rows["norms+quant"] = timed(lambda: _norms_quant(f.x, f.norms, f.eps, f.h[0:1], aq, ad,
                                                     asum, ads), a.reps)
    total += rows["norms+quant"]

    # attention: the step with and without cached positions
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
        print(f"  {k:12s} {v:7.3f}")
    print(f"  {'sum':12s} {total:7.3f}  (each matrix over all layers: partly cache-hot)")
    print(f"  every matrix in step order {in_order:7.3f}  (weights stream as in a step)")
    print(f"  step at pos 1        {step0_ms:7.3f}  (step - matrices in order: "
          f"{step0_ms - in_order:.3f})")
    print(f"  step at pos {a.pos:<8d} {step_ms:7.3f}  (attention growth: "
          f"{step_ms - step0_ms:.3f})")


if __name__ == "__main__":
    main()
