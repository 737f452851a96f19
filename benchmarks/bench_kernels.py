"""Microbenchmark of the linear kernels: us per matvec and prefill matmul throughput.

    python benchmarks/bench_kernels.py [--threads 1 2] [--types q4_0 q8_0] [--quick]

Weights are random, quantized with edgellm.quant and read-only (as the memmapped file's
are). Shapes are SmolLM2-135M's (576 hidden, 1536 MLP, 49152 vocabulary) plus 2560x960,
the shape of notes/kernels.md. Each figure is the best of several timed runs (the machine
is noisy). "decode step" sums one token's matvecs of the whole model (30 layers x
q,k,v,o,gate,up,down + the output head), kernels called directly; "via linear()" is the
same through the validating Python entry point. "prefill" is x[128, K] @ W.T over the same
set of matrices, as tokens/s.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from edgellm import quant
from edgellm.format import Tensor
from edgellm.kernels import linear as L
from edgellm.kernels import matmul, matvec, simd

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (2560, 960)]
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
LAYERS, HEAD = 30, (49152, 576)


def best_time(fn, reps: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def make_weight(kind: str, N: int, K: int, rng) -> Tensor:
    data = quant.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, kind)
    data.flags.writeable = False
    return Tensor(f"w{N}x{K}", kind, (N, K), 32, data)


def kernel_call(w: Tensor, act: L.ActQ8, x: np.ndarray, out: np.ndarray, precise: bool):
    """The bare kernel linear() would run for T == 1, bypassing validation."""
    _, N, _, block, data = L._weight(w)
    one = numba.get_num_threads() == 1
    if w.type in L.QUANTIZED and not precise:
        k = getattr(matvec, f"mv_rows_{w.type}") if one else getattr(matvec, f"mv_{w.type}")
        if one:
            return lambda: k(data, block, act.xq, act.xd, act.xds, out, 0, N)
        return lambda: k(data, block, act.xq, act.xd, act.xds, out)
    k = getattr(matvec, f"mvp_rows_{w.type}") if one else getattr(matvec, f"mvp_{w.type}")
    if one:
        return lambda: k(data, block, x, out, 0, N)
    return lambda: k(data, block, x, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--types", nargs="+", default=["q4_0", "q4_1", "q8_0", "f16", "f32"])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--precise", action="store_true", help="also time precise mode")
    args = ap.parse_args()
    rounds = 5 if args.quick else 15
    rng = np.random.default_rng(0)
    print(f"SIMD path: {simd.SIMD_PATH}; numba {numba.__version__}; "
          f"threading layer {numba.config.THREADING_LAYER}")
    modes = [False, True] if args.precise else [False]
    for kind in args.types:
        ws = {s: make_weight(kind, *s, rng) for s in set(SHAPES) | set(LAYER) | {HEAD}}
        for precise in modes:
            if precise and kind not in L.QUANTIZED:
                continue
            tag = kind + (" precise" if precise else "")
            for nt in args.threads:
                numba.set_num_threads(nt)
                cells = []
                for N, K in SHAPES:
                    x = rng.standard_normal((1, K)).astype(np.float32)
                    act = L.quantize_act(x, L.ActQ8(1, K))
                    out = np.empty((1, N), np.float32)
                    fn = kernel_call(ws[(N, K)], act, x, out, precise)
                    reps = max(3, int(2e6 // (N * K)))
                    cells.append(f"{K}->{N} {best_time(fn, reps, rounds) * 1e6:7.1f}")
                # one decode step: the model's matvecs, kernels called directly / via linear
                step = [(ws[(N, K)], K, N) for N, K in LAYER * LAYERS + [HEAD]]
                xs = {K: rng.standard_normal((1, K)).astype(np.float32) for K in (576, 1536)}
                acts = {K: L.quantize_act(xs[K], L.ActQ8(1, K)) for K in xs}
                outs = {N: np.empty((1, N), np.float32) for N in (192, 576, 1536, 49152)}
                calls = [kernel_call(w, acts[K], xs[K], outs[N], precise) for w, K, N in step]
                step_lin = [(w, xs[K], outs[N], acts[K]) for w, K, N in step]

                def run_step(calls=calls):
                    for c in calls:
                        c()

                def run_linear(step_lin=step_lin, precise=precise):
                    for w, x, out, act in step_lin:
                        L.linear(w, x, out, precise=precise, act=None if precise else act)

                t_step = best_time(run_step, 3, max(3, rounds // 2))
                t_lin = best_time(run_linear, 3, max(3, rounds // 2))
                print(f"{tag:13s} {nt}t us/matvec: " + " | ".join(cells))
                print(f"{'':13s}    decode step {t_step * 1e3:6.2f} ms (via linear() "
                      f"{t_lin * 1e3:6.2f} ms, {(t_lin - t_step) / len(step) * 1e6:4.1f} us/call)")
                # prefill: T = 128 through every matrix of the model
                T = 128
                pre = []
                for N, K in LAYER + [HEAD]:
                    x = rng.standard_normal((T, K)).astype(np.float32)
                    pre.append((ws[(N, K)], x, np.empty((T, N), np.float32),
                                L.quantize_act(x, L.ActQ8(T, K))))

                def run_prefill(pre=pre, precise=precise):
                    for i, (w, x, out, act) in enumerate(pre):
                        for _ in range(LAYERS if i < len(LAYER) else 1):
                            L.linear(w, x, out, precise=precise,
                                     act=None if precise else act)

                t_pre = best_time(run_prefill, 1, max(2, rounds // 5))
                print(f"{'':13s}    prefill T={T}: {T / t_pre:7.0f} tok/s "
                      f"({t_pre * 1e3:.0f} ms for the model's matmuls)")
    _ = matmul  # imported so an import error shows up here, not mid-run


if __name__ == "__main__":
    main()
