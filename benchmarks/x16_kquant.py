"""Decode's K-quant matrix-vector products in the rows layout (kquant_kact.mv_kk: one row a
tile) against the x16 layout (x16_k.py: 16 rows a group, a row a lane), on a GGUF file's own
q4_k (or q6_k) matrices in its order (each read once a pass, as a decode token reads them).

    python benchmarks/x16_kquant.py MODEL.gguf [--type q4_k] [--threads 1 2] [--passes 10]
        [--act int16]

Both layouts' copies are made in memory first (the x16 one by layout.to_x16, as convert-model
writes it), then for each thread count the two alternate pass by pass in one process (a host
whose memory bandwidth moves from second to second moves both alike): the medians of the
passes' wall times, as ms and GB/s of the type's bytes. scale.py's files (~/.cache/edgellm/scale)
have the real shapes; quote `uptime` with the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from edgellm.kernels.act_quant_k import ActK, quantize_k
from edgellm.kernels.kquant_kact import mv_kk
from edgellm.kernels.x16_k import make_x16_k
from edgellm.modelfile import layout as layouts
from edgellm.modelfile import quant


def load(path: str, kind: str) -> list[np.ndarray]:
    """The GGUF file's matrices of type `kind`, in its order, as uint8 [N, row bytes]
    copies (those that fit x16: rows in groups of 16)."""
    from gguf import GGUFReader

    out = []
    for t in GGUFReader(path).tensors:
        if t.tensor_type.name == kind.upper() and int(t.shape[1]) % layouts.GROUP_ROWS == 0:
            out.append(np.array(t.data).reshape(int(t.shape[1]), -1))
    if not out:
        raise SystemExit(f"{path}: no {kind} matrices")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--act", choices=("int16", "int8"), default="int16")
    ap.add_argument("--type", choices=layouts.X16_SB, default="q4_k")
    a = ap.parse_args()
    rows = load(a.model, a.type)
    SB = layouts.SB_BYTES[a.type]
    x16 = [layouts.to_x16(w, a.type) for w in rows]
    nbytes = sum(w.nbytes for w in rows)
    rng = np.random.default_rng(0)
    acts = {}
    for K in {w.shape[1] // SB * 256 for w in rows}:
        acts[K] = quantize_k(rng.standard_normal((1, K)).astype(np.float32),
                             ActK(1, K, np.dtype(a.act)))
    outs = [np.zeros((1, w.shape[0]), np.float32) for w in rows]
    code = quant.TYPES[a.type].code
    mv16 = make_x16_k(a.type)["mv_sb"]

    def run_rows():
        for w, o in zip(rows, outs, strict=True):
            x = acts[w.shape[1] // SB * 256]
            mv_kk(code, w, x.xq, x.xd, x.xb, o)

    def run_x16():
        for w, o in zip(x16, outs, strict=True):
            x = acts[w.shape[1] // (16 * SB) * 256]
            mv16(w, x.xq, x.xd, x.xb, o)

    print(f"{a.model}: {len(rows)} {a.type} matrices, {nbytes / 1e6:.1f} MB, {a.act} "
          "activations")
    for nt in a.threads:
        numba.set_num_threads(nt)
        run_rows(), run_x16()  # compiled, and the threads started
        times = {"rows": [], "x16": []}
        for _ in range(a.passes):
            for name, fn in (("rows", run_rows), ("x16", run_x16)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"threads {nt}: rows {med['rows'] * 1e3:.1f} ms ({nbytes / med['rows'] / 1e9:.1f}"
              f" GB/s), x16 {med['x16'] * 1e3:.1f} ms ({nbytes / med['x16'] / 1e9:.1f} GB/s): "
              f"x16 {med['rows'] / med['x16']:.2f}x")


if __name__ == "__main__":
    main()
