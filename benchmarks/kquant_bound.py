"""One decode-sized matrix-vector product per weight type against the memory bound: GB/s of
weight bytes read by the decode rows (registry.INT8[type].rows: q4_0 and the K-quants, int16
and int8 activations in blocks of 32; the K-quants also on super-block activations,
kquant_kact.mv_rows_kk: --acts int16-sb int8-sb) and by a numba sum streaming the same bytes.

    python benchmarks/kquant_bound.py [--shape 2048 8192] [--types q4_0 q4_k q6_k]
        [--mb 160] [--reps 5] [--acts int16 int8 int16-sb int8-sb]
    python benchmarks/kquant_bound.py --file MODEL.edgellm [--reps 5]

--file: the whole decode's bound instead: a streaming read of the file's bytes (a numba sum,
the file mapped as the runtime maps it) on 1 and on 2 threads, as GB/s and as tokens/s
were each token to read every byte once (the weights are nearly all of the file).

Weights are random bytes with a fixed f16 scale (the kernels' time does not depend on the
values), several copies of the N x K matrix cycled so that --mb MB are read from memory
between two reads of a copy (a 1.7B decode step streams ~1 GB: nothing stays in L3). One
thread (the decode step's threads each stream their own rows). Prints, per type and
activation, us of CPU time per matvec (the best round's mean), GB/s and the share of the
streaming read's GB/s over the same bytes. The machine's load moves these figures: quote
`uptime` with them, and compare builds by running this script alternately under each
(PYTHONPATH decides which edgellm it imports).
"""

from __future__ import annotations

import argparse
import os
import time

import numba
import numpy as np
from numba import njit

from edgellm.kernels import act_quant, act_quant_k, kquant_kact, registry
from edgellm.modelfile import quant

SCALES = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,),
          "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}  # byte offsets of a block's f16 scales


@njit(cache=True, fastmath=True)
def stream(w):
    """Sum of w's bytes as uint64 words: one read of the memory, vectorized."""
    v = w.reshape(-1).view(np.uint64)
    s = np.uint64(0)
    for j in range(v.size):
        s += v[j]
    return s


@njit(parallel=True, cache=True)
def stream_threads(w, nt):
    """stream(w) split into nt contiguous parts (whole words), one a thread."""
    part = (w.size // 8 + nt - 1) // nt * 8
    sums = np.zeros(nt, np.uint64)
    for p in numba.prange(nt):
        sums[p] = stream(w[p * part:min(w.size // 8 * 8, p * part + part)])
    return sums.sum()


def file_bound(path: str, reps: int) -> None:
    """Print the streaming read of the file at `path` on 1 and 2 threads (--file)."""
    m = np.memmap(path, np.uint8, mode="r")
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {path}: "
          f"{m.size / 1e6:.0f} MB")
    for nt in (1, 2):
        numba.set_num_threads(nt)
        stream_threads(m, nt)  # compile, and bring the file into the page cache
        wall = cpu = np.inf
        for _ in range(reps):
            t, c = time.perf_counter(), time.process_time()
            stream_threads(m, nt)
            wall = min(wall, time.perf_counter() - t)
            cpu = min(cpu, (time.process_time() - c) / nt)
        print(f"  {nt} thread(s), best of {reps}: wall {m.size / wall / 1e9:.1f} GB/s = "
              f"{1 / wall:.1f} tok/s; CPU time a thread {m.size / cpu / 1e9:.1f} GB/s = "
              f"{1 / cpu:.1f} tok/s (a shared machine: the wall figure is the bound only when "
              f"quiet)", flush=True)


def weights(kind: str, N: int, K: int, copies: int, rng) -> list[np.ndarray]:
    t = quant.TYPES[kind]
    B = t.blocks[0] if t.superblock else 32
    nb, bb = K // B, t.block_bytes(B)
    out = []
    for _ in range(copies):
        w = rng.integers(0, 256, (N, nb, bb), np.uint8)
        for off in SCALES[kind]:
            w[:, :, off:off + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        w = w.reshape(N, nb * bb)
        w.flags.writeable = False
        out.append(w)
    return out


def matvec(rows, B: int, xq, xd, xds, out):
    """w -> out[0] = w @ x[0] by the decode rows kernel `rows`."""
    return lambda w: rows(w, B, xq, xd, xds, out, 0, out.shape[1])


def matvec_sb(code: int, a, out):
    """w -> out[0] = w @ x[0] by the K-quant rows on super-block activations a (ActK)."""
    return lambda w: kquant_kact.mv_rows_kk(code, w, a.xq, a.xd, a.xb, out, 0, out.shape[1])


def timed(fn, ws, reps: int) -> float:
    """Best round's mean CPU seconds per call (this thread's: a shared machine's other
    processes take wall time, not this), each round one call per copy."""
    for w in ws:
        fn(w)
    best = np.inf
    for _ in range(reps):
        t = time.thread_time()
        for w in ws:
            fn(w)
        best = min(best, (time.thread_time() - t) / len(ws))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=2, default=[2048, 8192], metavar=("N", "K"))
    ap.add_argument("--types", nargs="+", default=["q4_0", "q4_k", "q6_k"])
    ap.add_argument("--mb", type=float, default=160.0, help="bytes cycled between reads")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--acts", nargs="+", default=["int16", "int8", "int16-sb", "int8-sb"],
                    choices=["int16", "int8", "int16-sb", "int8-sb"])
    ap.add_argument("--file", help="the whole file's streaming bound instead (module doc)")
    args = ap.parse_args()
    if args.file:
        file_bound(args.file, args.reps)
        return
    if set(args.types) - set(SCALES):
        ap.error(f"--types: one of {' '.join(SCALES)}")
    numba.set_num_threads(1)
    N, K = args.shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, K)).astype(np.float32)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {N}x{K}, 1 thread")
    for kind in args.types:
        t = quant.TYPES[kind]
        B = t.blocks[0] if t.superblock else 32
        if K % B:
            print(f"{kind}: skipped ({K} columns are not whole blocks of {B})")
            continue
        nbytes = N * (K // B) * t.block_bytes(B)
        ws = weights(kind, N, K, max(2, int(np.ceil(args.mb * 1e6 / nbytes))), rng)
        s = timed(stream, ws, args.reps)
        line = f"{kind}: {nbytes / 1e6:.1f} MB, stream {nbytes / s / 1e9:.1f} GB/s"
        for act in args.acts:
            dtype = np.int16 if act.startswith("int16") else np.int8
            out = np.zeros((1, N), np.float32)
            if act.endswith("-sb"):  # super-block activations (K-quants only)
                if t.code not in kquant_kact.KK_CODES:
                    continue
                a = act_quant_k.quantize_k(x, act_quant_k.ActK(1, K, dtype))
                m = timed(matvec_sb(t.code, a, out), ws, args.reps)
            else:
                xq = np.zeros((1, K), dtype)
                xd, xs, xds = (np.zeros((1, K // 32), d)
                               for d in (np.float32, np.int32, np.float32))
                act_quant.quantize_rows(x, xq, xd, xs, xds, 0, 1)
                m = timed(matvec(registry.INT8[kind].rows, B, xq, xd, xds, out), ws, args.reps)
            line += (f"; {act} {m * 1e6:.0f} us {nbytes / m / 1e9:.1f} GB/s "
                     f"({s / m:.0%} of stream)")
        print(line, flush=True)


if __name__ == "__main__":
    main()
