"""Prefill's x16 matrix product alone (x16.py's "mm", q4_0, int16 activations) on the 1.7B
shapes' matrices, one thread, CPU time a token (the medians of the rounds), and the 24
layers' matrices in tokens/s: run it under two source trees alternately (PYTHONPATH) to
compare their tiles at the same load.

    python benchmarks/prefill_mm.py [TOKENS=128] [ROUNDS=3]
"""
import os
import sys
import time

import numba
import numpy as np

numba.set_num_threads(1)
from edgellm.kernels import registry  # noqa: E402 (after the thread count)
from edgellm.modelfile.layout import to_x16  # noqa: E402

T = int(sys.argv[1]) if len(sys.argv) > 1 else 128
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
mm = registry.X16["q4_0"]["mm"]
rng = np.random.default_rng(0)
shapes = {"qkvo": (2048, 2048, 4), "gateup": (8192, 2048, 2), "down": (2048, 8192, 1)}
runs = {}
for name, (N, K, _) in shapes.items():
    nb = K // 32
    w = rng.integers(0, 256, (N, nb * 18), dtype=np.uint8)
    w.reshape(N, nb, 18)[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    wi = to_x16(w, "q4_0")
    xd = np.full((T, nb), 1e-4, np.float32)
    xs = np.zeros((T, nb), np.int32)
    out = np.zeros((T, N), np.float32)
    xq = rng.integers(-32767, 32768, (T, K)).astype(np.int16)
    mm(wi, xq, xd, xs, xd, out, T)
    runs[name] = (wi, xq, xd, xs, out)
took = {k: [] for k in runs}
for _ in range(rounds):
    for k, (wi, xq, xd, xs, out) in runs.items():
        t = time.process_time()
        mm(wi, xq, xd, xs, xd, out, T)
        took[k].append(time.process_time() - t)
tot = 0.0
for k, v in took.items():
    t = float(np.median(v))
    tot += 24 * shapes[k][2] * t / T
    print(f"{k}: {t / T * 1e6:.1f} us/token", end="; ")
print(f"24 layers: {1 / tot:.1f} tok/s (load {os.getloadavg()[0]:.1f})")
