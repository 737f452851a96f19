"""K-quant kernels in one process: integer-activation (kernels/kquant_int.py) against
float-activation (kernels/kquant.py) and against q8_0's int kernels on the same shape.

    python benchmarks/kquant_kernels.py [--shape 640 2048] [--threads 1] [--types q4_k ...]
        [-T 64]

Weights are random rows quantized by the reference (default: Gemma 3 270M's ffn_down, K a
multiple of 256 as K-quants need), hot in cache; x is int16 blocks as the
default decode step has them. Prints us per decode matvec and per prefill of T tokens, with
the ratios float / int and int / q8_0 (below 1: the K-quant is faster than q8_0). The best
of a few short runs: quote `uptime` with the numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellm.kernels import act_quant, kquant, kquant_int, matmul, matvec  # noqa: E402
from edgellm.modelfile import quant  # noqa: E402


def best(fn, reps: int, rounds: int = 5) -> float:
    fn()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        ts.append((time.perf_counter() - t) / reps)
    return min(ts) * 1e6


def raw_weight(kind: str, N: int, K: int, rng) -> np.ndarray:
    t = quant.TYPES[kind]
    w = quant.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.1, kind,
                       t.blocks[0] if t.superblock else 32)
    w.flags.writeable = False
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=2, default=[640, 2048], metavar=("N", "K"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--types", nargs="+", default=list(kquant_int.KQ_TYPES))
    ap.add_argument("-T", type=int, default=64, help="prefill tokens")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    (N, K), T = args.shape, args.T
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq = np.zeros((T, K), np.int16)
    xd, xs, xds = (np.zeros((T, K // 32), d) for d in (np.float32, np.int32, np.float32))
    act_quant.quantize_rows(x, xq, xd, xs, xds, 0, T)
    out = np.zeros((T, N), np.float32)
    reps = max(3, int(2e6 // (N * K)))
    q8 = raw_weight("q8_0", N, K, rng)
    q8_mv = best(lambda: matvec.mv_rows_q8_0(q8, 32, xq, xd, xds, out, 0, N), reps)
    q8_mm = best(lambda: matmul.mm_q8_0(q8, 32, xq, xd, xs, xds, out, T, args.threads), 2)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {N}x{K}, "
          f"{args.threads} thread(s), T={T}; q8_0: decode {q8_mv:.0f} us, prefill {q8_mm:.0f} us")
    for kind in args.types:
        w, code = raw_weight(kind, N, K, rng), quant.TYPES[kind].code
        mv = best(lambda: kquant_int.mv_rows_kq(code, w, xq, xd, xds, out, 0, N), reps)
        fmv = best(lambda: kquant.mvp_rows_k(code, w, x, out, 0, N), reps)
        mm = best(lambda: kquant_int.mm_kq(code, w, xq, xd, xs, xds, out, T, args.threads), 2)
        fmm = best(lambda: kquant.gemm_k(code, w, x, out), 2)
        print(f"{kind}: decode int {mv:.0f} us, float {fmv:.0f} us ({fmv / mv:.2f}x), "
              f"int / q8_0 {mv / q8_mv:.2f}; prefill int {mm:.0f} us, float {fmm:.0f} us "
              f"({fmm / mm:.2f}x), int / q8_0 {mm / q8_mm:.2f}")


if __name__ == "__main__":
    main()
