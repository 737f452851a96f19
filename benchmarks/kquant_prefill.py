"""Where K-quant prefill's time goes: each matrix kind's prefill kernel on the 1.7B shapes,
against the dot-product instructions it must issue, beside q4_0's (the x16 tiles).

    python benchmarks/kquant_prefill.py [--tokens 128] [--rounds 5] [--types q4_0 q4_k q6_k]
    python benchmarks/kquant_prefill.py --model MODEL.edgellm [--tokens 128] [--rounds 5]

Per type and shape (q/k/v/o 2048x2048, gate/up 8192x2048, down 2048x8192): the prefill
matmul (registry.INT8[type].matmul; q4_0: x16.py's "mm") of --tokens tokens of int16
activations (the default) on one thread, CPU time a token (the median of the rounds), and
the int16 products it does in 512-bit dot instructions (N K T / 32: a vpdpwssd, or two
vpdpbusd on byte halves, does 32) a second as a share of one core's peak for the
instruction alone (tile_bound.py's sixteen independent chains). Then the matrices of the
1.7B Q4_K_M file (per layer q/k/o and gate/up q4_k, v and down q4_k in half the layers and
q6_k in the other half) in tokens/s of CPU time: the prefill's bound from its tiles.

--model: the whole prefill of --tokens random tokens (the model's forward, as `edgellm bench`
times it), CPU time of this process, one thread: tokens/s of the median round.
Compare checkouts by running this alternately under each (PYTHONPATH decides which edgellm
it imports), and quote the load average it prints.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling benchmarks

from kquant_bound import SCALES, weights  # noqa: E402
from tile_bound import CHAINS, _peak  # noqa: E402

from edgellm.kernels import act_quant, registry  # noqa: E402
from edgellm.modelfile import quant  # noqa: E402
from edgellm.modelfile.layout import to_x16  # noqa: E402

SHAPES = {"q/k/v/o": (2048, 2048), "gate/up": (8192, 2048), "down": (2048, 8192)}
# the 1.7B Q4_K_M file's matrices of one layer, by kind and shape (v and down: q6_k in
# half the layers); q4_0's file: all q4_0
MIX_K = {("q4_k", "q/k/v/o"): 3.5, ("q6_k", "q/k/v/o"): 0.5, ("q4_k", "gate/up"): 2,
         ("q4_k", "down"): 0.5, ("q6_k", "down"): 0.5}
MIX_0 = {("q4_0", "q/k/v/o"): 4, ("q4_0", "gate/up"): 2, ("q4_0", "down"): 1}


def peak() -> float:
    """One core's 512-bit dot instructions a second (CPU time, the best of 5)."""
    count = 20_000_000
    _peak(count)
    best = np.inf
    for _ in range(5):
        t = time.process_time()
        _peak(count)
        best = min(best, time.process_time() - t)
    return count * CHAINS / best


def product(kind: str, N: int, K: int, T: int, rng):
    """A call (no arguments) running type `kind`'s prefill kernel on random N x K weights and
    T tokens of int16 activations."""
    w = weights(kind, N, K, 1, rng)[0]
    x = rng.standard_normal((T, K)).astype(np.float32)
    nb = K // 32
    xq = np.zeros((T, K), np.int16)
    xd, xs, xds = (np.zeros((T, nb), d) for d in (np.float32, np.int32, np.float32))
    act_quant.quantize_rows(x, xq, xd, xs, xds, 0, T)
    out = np.zeros((T, N), np.float32)
    if kind == "q4_0":
        wi = to_x16(w, "q4_0")
        wi.flags.writeable = False
        mm = registry.X16["q4_0"]["mm"]
        return lambda: mm(wi, xq, xd, xs, xds, out, T)
    mm = registry.INT8[kind].matmul
    B = 32 if kind == "q4_0" else 256
    return lambda: mm(w, B, xq, xd, xs, xds, out, T, 1)


def tiles(types: list[str], T: int, rounds: int) -> None:
    """The per-kind table (the module docstring)."""
    numba.set_num_threads(1)
    pk = peak()
    rng = np.random.default_rng(0)
    runs = {(k, s): product(k, *SHAPES[s], T, rng) for k in types for s in SHAPES}
    took = {key: [] for key in runs}
    for fn in runs.values():
        fn()  # compile and warm
    for _ in range(rounds):
        for key, fn in runs.items():
            t = time.process_time()
            fn()
            took[key].append(time.process_time() - t)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {T} tokens, int16 "
          f"activations, 1 thread; dot-instruction peak {pk / 1e9:.2f} G/s")
    med = {key: float(np.median(v)) for key, v in took.items()}
    for (kind, s), t in med.items():
        N, K = SHAPES[s]
        dots = N * K * T / 32
        print(f"  {kind} {s:8s} {N}x{K}: {t / T * 1e6:6.1f} us a token, "
              f"{dots / t / 1e9:4.2f} G dots/s = {dots / t / pk:4.0%} of the peak")
    for name, mix in (("1.7B Q4_K_M", MIX_K), ("1.7B Q4_0", MIX_0)):
        if all(key in med for key in mix):
            per = sum(n * med[key] / T for key, n in mix.items()) * 24
            print(f"  {name}'s 24 layers of matrices: {1 / per:6.1f} tokens/s of CPU time")


def model(path: str, T: int, rounds: int) -> None:
    """The --model figure (the module docstring)."""
    import edgellm

    llm = edgellm.load(path, threads=1, context=T + 16)
    m = llm.model
    rng = np.random.default_rng(1)
    m.reset()
    m.forward(rng.integers(0, llm.args.vocab_size, 8), want="last")  # compile and warm
    took = []
    for _ in range(rounds):
        prompt = rng.integers(0, llm.args.vocab_size, T)
        m.reset()
        t = time.process_time()
        m.forward(prompt, want="last")
        took.append(time.process_time() - t)
    print(f"prefill {T} tokens, 1 thread: {T / np.median(took):6.1f} tokens/s of CPU time "
          f"(rounds {' '.join(f'{T / v:.1f}' for v in took)}; load average "
          f"{os.getloadavg()[0]:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--types", nargs="+", default=["q4_0", "q4_k", "q6_k"],
                    choices=["q4_0", "q4_k", "q5_k", "q6_k"])
    ap.add_argument("--model", help="time the whole prefill of this model file instead")
    args = ap.parse_args()
    if args.model:
        model(args.model, args.tokens, args.rounds)
    else:
        tiles(args.types, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
