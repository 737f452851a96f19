"""Microbenchmark of the linear kernels: us per matvec, a decode step, prefill throughput.

    python benchmarks/bench_kernels.py [--threads 1 2] [--types q4_0 q8_0] [--precise] [--quick]

Per-shape matvec times (SmolLM2-135M's shapes: 576 hidden, 1536 MLP, 49152 vocabulary,
and 2560x960 from notes/kernels.md) are with the weights hot in cache. The "decode step"
is what a token costs: one matvec per matrix of the whole model (30 layers x q,k,v,o,
gate,up,down + the output head), each layer with its own weights so that they stream from
DRAM as in a real run; kernels called directly, then through linear() (validation and
dispatch). "prefill" is x[128, K] @ W.T over the same matrices (hot), as tokens/s.
Weights are random blocks, read-only like the memmapped file's. Every figure is the best
of several short runs: the machine is noisy, and a burst from another process stalls
omp's barrier on 2 threads.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from edgellm.kernels import linear as L
from edgellm.kernels import registry
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor
from edgellm.runtime import simd

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (2560, 960)]
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
LAYERS, HEAD = 30, (49152, 576)


def best_time(fn, reps: int, rounds: int) -> float:
    """Seconds per call: the best of `rounds` runs of `reps` calls."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def random_weight(kind: str, N: int, K: int, rng) -> Tensor:
    """A weight of random blocks (valid scales), without quantizing floats: fast."""
    if kind in ("f32", "f16"):
        data = (rng.standard_normal((N, K), np.float32) * 0.05).astype(quant.FLOAT_DTYPE[kind])
    else:
        blocks = rng.integers(0, 256, (N, K // 32, quant.TYPES[kind].block_bytes(32)),
                              dtype=np.uint8)
        blocks[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        if kind == "q4_1":
            blocks[:, :, 2:4] = np.frombuffer(np.float16(-0.08).tobytes(), np.uint8)
        data = blocks.reshape(N, -1)
    data.flags.writeable = False
    return Tensor(f"w{N}x{K}", kind, (N, K), 32, data)


def kernel_call(w: Tensor, act: L.ActQ8, x: np.ndarray, out: np.ndarray, precise: bool):
    """The bare kernel linear() runs for T == 1 (same choice of serial/parallel)."""
    kind, N, _, block, data = L._weight(w)
    one = numba.get_num_threads() == 1
    if kind in registry.INT8 and not precise:
        rows, par, _ = registry.INT8[kind]
        if one:
            return lambda: rows(data, block, act.xq, act.xd, act.xds, out, 0, N)
        return lambda: par(data, block, act.xq, act.xd, act.xds, out)
    rows, par = registry.FLOAT[kind].rows, registry.FLOAT[kind].parallel
    if one:
        return lambda: rows(data, block, x, out, 0, N)
    return lambda: par(data, block, x, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--types", nargs="+", default=["q4_0", "q4_1", "q8_0", "f16", "f32"])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--precise", action="store_true", help="also time precise mode")
    args = ap.parse_args()
    rounds = 8 if args.quick else 30
    rng = np.random.default_rng(0)
    print(f"SIMD path {simd.SIMD_PATH}; numba {numba.__version__}; threading layer "
          f"{numba.config.THREADING_LAYER}; times in us unless marked")
    xs = {K: rng.standard_normal((1, K)).astype(np.float32) for K in (576, 960, 1536)}
    acts = {K: L.quantize_act(x, L.ActQ8(1, K)) for K, x in xs.items()}
    outs = {N: np.empty((1, N), np.float32) for N in (192, 576, 1536, 2560, 49152)}
    T = 128
    xp = {K: rng.standard_normal((T, K)).astype(np.float32) for K in (576, 1536)}
    actp = {K: L.quantize_act(x, L.ActQ8(T, K)) for K, x in xp.items()}
    outp = {N: np.empty((T, N), np.float32) for N in (192, 576, 1536, 49152)}
    for kind in args.types:
        hot = {s: random_weight(kind, *s, rng) for s in set(SHAPES)}
        model = [random_weight(kind, N, K, rng) for _ in range(LAYERS) for N, K in LAYER]
        model.append(hot[HEAD])
        for precise in [False, True] if args.precise else [False]:
            if precise and kind not in registry.INT8:
                continue
            tag = kind + (" precise" if precise else "")
            for nt in args.threads:
                numba.set_num_threads(nt)
                cells = []
                for N, K in SHAPES:
                    fn = kernel_call(hot[(N, K)], acts[K], xs[K], outs[N], precise)
                    reps = max(2, int(5e5 // (N * K)))
                    cells.append(f"{K}->{N} {best_time(fn, reps, rounds) * 1e6:6.1f}")
                print(f"{tag:13s} {nt}t matvec: " + " | ".join(cells))

                calls = [kernel_call(w, acts[w.shape[1]], xs[w.shape[1]], outs[w.shape[0]],
                                     precise) for w in model]
                lin = [(w, xs[w.shape[1]], outs[w.shape[0]],
                        None if precise else acts[w.shape[1]]) for w in model]

                def step(calls=calls):
                    for c in calls:
                        c()

                def step_linear(lin=lin, precise=precise):
                    for w, x, out, act in lin:
                        L.linear(w, x, out, precise=precise, act=act)

                t_step = best_time(step, 1, max(4, rounds // 2))
                t_lin = best_time(step_linear, 1, max(4, rounds // 2))
                print(f"{'':13s}    decode step {t_step * 1e3:5.2f} ms ({1 / t_step:4.0f}/s), "
                      f"via linear() {t_lin * 1e3:5.2f} ms "
                      f"({(t_lin - t_step) / len(model) * 1e6:+.1f} us/call)")

                def prefill(precise=precise, hot=hot, model=model):
                    for i, (N, K) in enumerate(LAYER + [HEAD]):
                        w = hot.get((N, K)) or model[i]
                        for _ in range(LAYERS if i < len(LAYER) else 1):
                            L.linear(w, xp[K], outp[N], precise=precise,
                                     act=None if precise else actp[K])

                t_pre = best_time(prefill, 1, max(2, rounds // 4))
                print(f"{'':13s}    prefill T={T}: {T / t_pre:5.0f} tok/s "
                      f"({t_pre * 1e3:.0f} ms for the model's matmuls)")


if __name__ == "__main__":
    main()
