"""How close the batched step's interleaved tiles are to what the CPU can issue: the bound on
issue 24's 4 rows / 1 row at the default (int16 activation) precision.

    python benchmarks/tile_bound.py [--rows 184320] [--cols 576] [--reps 7]
    python benchmarks/tile_bound.py --matvec [--rounds 7]
    python benchmarks/tile_bound.py --prefill [--rounds 3] [--tokens 128]
    python benchmarks/tile_bound.py --step MODEL [--rounds 7]

--matvec: decode's matrix-vector product on the x16 layout (q4_0, the 1.7B shapes 2048x2048,
8192x2048, 2048x8192) on one thread, int16 activations as words (vpdpwssd on codes widened
to 16 bits, the tiles' path before the halves) against halves() (vpdpbusd) and int8
activations: from L3 (one matrix again and again) and from memory (copies filling 400 MB),
CPU time, the variants alternating each round; the medians. 2026-12-05, the same Zen 4 but
loaded (load 15-23, 7 helpers on 2 cores): from L3 words 46-52 GB/s, halves 65-73 (1.4-1.5x);
from memory, with the one-token tiles' prefetch 2048 bytes ahead: words 27.5-32.6 GB/s,
halves 28-34, int8 31-36; 8192 ahead (interleave.PF_DECODE): words 33-39, halves 30-37.5,
int8 32-39; this script at load 4: from L3 halves / words 1.30-1.44x, from memory
0.90-1.01x. So decode keeps the words there; the 2- and 4-token tiles (prefill, the
batched step) gain 1.35-1.47x from halves. (That host was a Zen 5. On a Zen 4, whose
512-bit instructions issue as two halves, 2026-12-06, load 0.8, 2560x960, 960x2560 and
8192x2048: from L3 words 21-24 GB/s, halves 30-45, int8 40-57; from memory words 16.6-20.7,
halves 19.5-26.2: x16.DECODE_HALVES there, simd.HALF_PUMPED_512.)

--step MODEL: the file's q4_0 x16 matrices in its decode step's order (each read once a
pass, as a token reads them), words against halves on 1 and 2 threads, alternating pass by
pass in one process (a host whose memory bandwidth moves from second to second moves all
four alike), wall time; 3 x --rounds passes.

--prefill: prefill's x16 matrix product (x16.py's "mm", q4_0) on the 1.7B shapes' matrices
(q/k/v/o 2048x2048, gate/up 8192x2048, down 2048x8192) for --tokens tokens on one thread,
int16 activations (halves on VNNI: two vpdpbusd a product of four) against int8 (one), CPU
time a token and matrix, the medians of the rounds, and the dot instructions a second
against one core's vpdpbusd peak (sixteen independent chains of it alone), with the whole
model's matrices (24 layers) in tokens/s of CPU time: the prefill's bound from its tiles.

Prints one core's vpdpwssd peak (sixteen independent chains of the instruction alone; then
fourteen with two float FMAs an iteration: the same time if the FMAs issue beside it, more
if they share its pipes), then the q4_1 interleaved tiles (interleave.py) on 1, 2 and 4
tokens, int16 and int8 activations: from L2 (1536x576, one thread) and from memory (--rows x
--cols, the 30 layers' 66 MB by default, numba's threads), as vpdpwssd (vpdpbusd) a second
and as a share of the peak times the threads (vpdpbusd's peak is vpdpwssd's: one a cycle
on Zen 4).

Per group of 16 rows and block of 32 columns a token costs 16 vpdpwssd (int16) or 8 vpdpbusd
(int8), and three float operations on the FMA pipes (q4_1's dx dw, fma(tot, .., acc),
fma(mw, xds, acc)); the nibble shifts and masks, the int-to-float conversions and the loads
issue beside vpdpwssd (a C loop, gcc -march=native: 8 vpdpwssd + 2 shifts, 4 ands, or 2 adds
and a conversion an iteration take 8 cycles; + 2 FMAs, 10). Where the FMAs share its pipes
the int16 4-token tile's bound is 64 + 12 = 76 cycles a group-block: 84% of the vpdpwssd
peak, whatever the code.

2026-12-05, the 2-core Zen 4 KVM guest (load ~0.3): peak 3.67 G/s a core (one a cycle), FMAs
shared (1.00x); int16, 4 tokens: 76% of the peak from L2, 73% from memory (2.48 ms for the
layers' 66 MB on 2 threads, against 1.30 for 1 token): within 10-13% of the bound, so the
4-row step (5.2-5.6 ms alone against 1 row's 2.75-3.2) could lose ~0.3 ms at most here.
int8, 4 tokens: 1.57 ms from memory (42 GB/s: bound by memory, not the dot products).
"""

from __future__ import annotations

import argparse
import os
import time

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, typed, types
from numba.core import cgutils
from numba.extending import intrinsic

from edgellm.codegen.ir import F32, I32, _c, _llvm_fn, _v, vpdpwssd
from edgellm.kernels.interleave import halves, interleave
from edgellm.kernels.tiles import TILES
from edgellm.modelfile import quant
from edgellm.modelfile.layout import to_x16
from edgellm.runtime.simd import VNNI
from edgellm.step import batch_step as bs

Q4_0, Q4_1 = quant.TYPES["q4_0"].code, quant.TYPES["q4_1"].code

CHAINS = 16  # independent accumulators: enough for two issued a cycle (Zen 5)


def _chains(n_fma: int):
    """An intrinsic running `count` iterations of CHAINS - n_fma vpdpwssd and n_fma float
    FMAs, each on its own accumulator; returns the sum of their lanes 0 (so none is dropped)."""

    @intrinsic
    def run(typingctx, count):
        sig = types.int64(types.int64)

        def codegen(context, builder, signature, args):
            v16i, v16f = _v(I32, 16), _v(F32, 16)
            fma = _llvm_fn(builder, "llvm.fma.v16f32", v16f, [v16f] * 3)
            w, x = _c(v16i, list(range(16))), _c(v16i, [3] * 16)
            fa, fb = _c(v16f, [0.999] * 16), _c(v16f, [0.001] * 16)
            slots = []
            for j in range(CHAINS):
                typ = v16f if j < n_fma else v16i
                s = cgutils.alloca_once(builder, typ)
                start = 2.0 if typ is v16f else j + 1  # 2.0: not the FMA chain's fixed
                builder.store(_c(typ, [start] * 16), s)  # point (1.0), which LLVM folds
                slots.append(s)
            with cgutils.for_range(builder, args[0]):
                for j, s in enumerate(slots):
                    a = builder.load(s)
                    builder.store(builder.call(fma, [a, fa, fb]) if j < n_fma
                                  else vpdpwssd(builder, a, w, x), s)
            total = ir.Constant(ir.IntType(64), 0)
            for j, s in enumerate(slots):
                lane = builder.extract_element(builder.load(s), _c(I32, 0))
                if j < n_fma:
                    lane = builder.fptosi(lane, I32)
                total = builder.add(total, builder.sext(lane, ir.IntType(64)))
            return total

        return sig, codegen

    return run


_dp_only, _dp_fma = _chains(0), _chains(2)


@njit(cache=False)
def _peak(count):
    return _dp_only(count)


@njit(cache=False)
def _shared(count):
    return _dp_fma(count)


@njit(parallel=True, cache=False)
def _tiles(wi, xq, xd, xs, xds, out, n, nt):
    """Every group of wi through bs._interleaved, the groups split between nt threads."""
    G = wi.shape[0]
    for tid in prange(nt):
        for g in range(G * tid // nt, G * (tid + 1) // nt):
            bs._interleaved(Q4_1, wi, g, xq, xd, xs, xds, out, n)


@njit(cache=False)
def _tiles_here(wi, xq, xd, xs, xds, out, n, reps):
    """reps times every group of wi through bs._interleaved on this thread (no parallel
    region to start: a small matrix's time is the tiles')."""
    for _ in range(reps):
        for g in range(wi.shape[0]):
            bs._interleaved(Q4_1, wi, g, xq, xd, xs, xds, out, n)


def _best(reps: int, fn, *args) -> float:
    """The least time of reps calls fn(*args), after one call to compile and warm."""
    fn(*args)
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def _matrix(rows: int, cols: int, rng) -> np.ndarray:
    """A random q4_1 matrix (scales 0.01), interleaved (either activation type reads it)."""
    nb = cols // 32
    w = rng.integers(0, 256, (rows, nb * 20), dtype=np.uint8)
    w.reshape(rows, nb, 20)[..., 0:4] = np.frombuffer(np.float16(0.01).tobytes() * 2, np.uint8)
    return interleave(w, "q4_1")


_I1 = TILES[Q4_0]["i1"]


@njit(cache=False)
def _mv_words(wi, xq, xd, xs, xds, out):
    """Decode's x16 matvec on the int16 words (or int8 activations): every group, one tile."""
    for g in range(wi.shape[0]):
        _I1(wi, g, xq, xd, xs, xds, 0, out, 16 * g)


@njit(cache=False)
def _mv_halves(wi, xq, xd, xs, xds, out):
    """The same on halves() made from xq first, as x16.py's mv_rows does."""
    xh = np.empty((xq.shape[0], 2 * xq.shape[1]), np.uint8)
    halves(xq, xh)
    _mv_words(wi, xh, xd, xs, xds, out)


def matvec(rounds: int) -> None:
    """The --matvec table (the module docstring)."""
    rng = np.random.default_rng(0)
    for N, K in ((2048, 2048), (8192, 2048), (2048, 8192)):
        nb = K // 32
        w = rng.integers(0, 256, (N, nb * 18), dtype=np.uint8)
        w.reshape(N, nb, 18)[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        one = to_x16(w, "q4_0")
        copies = [one] + [one.copy() for _ in range(max(2, 400_000_000 // one.nbytes) - 1)]
        x16 = rng.integers(-32768, 32768, (1, K)).astype(np.int16)
        x8 = rng.integers(-127, 128, (1, K)).astype(np.int8)
        xd = np.full((1, nb), 1e-4, np.float32)
        xs = np.zeros((1, nb), np.int32)
        out = np.zeros((1, N), np.float32)
        runs = {"words": (_mv_words, x16), "halves": (_mv_halves, x16), "int8": (_mv_words, x8)}
        took = {(k, where): [] for k in runs for where in ("L3", "memory")}
        for fn, x in runs.values():
            fn(one, x, xd, xs, xd, out)
        for _ in range(rounds):
            for k, (fn, x) in runs.items():
                for where, ws in (("L3", [one] * 50), ("memory", copies)):
                    t = time.process_time()
                    for wi in ws:
                        fn(wi, x, xd, xs, xd, out)
                    took[k, where].append((time.process_time() - t) / len(ws))
        for where in ("L3", "memory"):
            gbs = {k: one.nbytes / np.median(took[k, where]) / 1e9 for k in runs}
            print(f"q4_0 x16 {N}x{K} from {where:6s}: " + ", ".join(
                f"{k} {v:5.1f} GB/s" for k, v in gbs.items())
                + f"; halves / words {gbs['halves'] / gbs['words']:.2f}x")
    print(f"(load average {os.getloadavg()[0]:.1f})")


@njit(parallel=True, cache=False)
def _step_mv(wis, x, xd, xs, out, nt, form):
    """Every matrix of wis in order, each one's groups split between nt threads; form 1:
    each thread makes its own halves() of x first, as x16.py's mv_rows does on decode."""
    for wi in wis:
        k = wi.shape[1] // 16 // 18 * 32
        G = wi.shape[0]
        for t in prange(nt):
            xa = x[:, :k]
            if form == 1:
                xh = np.empty((1, 2 * k), np.uint8)
                halves(xa, xh)
                for g in range(G * t // nt, G * (t + 1) // nt):
                    _I1(wi, g, xh, xd, xs, xd, 0, out, 16 * g)
            else:
                for g in range(G * t // nt, G * (t + 1) // nt):
                    _I1(wi, g, xa, xd, xs, xd, 0, out, 16 * g)


def step(path: str, rounds: int) -> None:
    """--step: a model's x16 q4_0 matrices in its decode step's order, words against halves
    on 1 and 2 threads, the four alternating pass by pass; wall time, medians."""
    import edgellm
    from edgellm.step import decode_step as ds

    f = edgellm.load(path, threads=2, context=256).model.fused
    wis = typed.List()
    for op in f.prog:
        m = f.mats[int(op[1])] if op[0] == ds.PROJ else None
        if m is not None and m[ds.MAT_LAYOUT] == ds.LAYOUT_X16 and m[ds.MAT_KIND] == Q4_0:
            off, rb, rows = m[ds.MAT_OFF], m[ds.MAT_ROW_BYTES], m[ds.MAT_ROWS]
            wis.append(f.blob[off:off + rows * rb].reshape((rows // 16, 16 * rb)))
    if not len(wis):
        raise SystemExit("tile_bound: no q4_0 matrix in the x16 layout in " + path)
    nbytes = sum(w.nbytes for w in wis)
    K = max(w.shape[1] // 16 // 18 * 32 for w in wis)
    rng = np.random.default_rng(0)
    x = rng.integers(-32768, 32768, (1, K)).astype(np.int16)
    xd, xs = np.full((1, K // 32), 1e-4, np.float32), np.zeros((1, K // 32), np.int32)
    out = np.zeros((1, 16 * max(w.shape[0] for w in wis)), np.float32)
    runs = [(nt, form) for nt in (1, 2) for form in (0, 1)]
    took = {r: [] for r in runs}
    for r in runs:
        _step_mv(wis, x, xd, xs, out, *r)
    for _ in range(rounds):
        for r in runs:
            t = time.perf_counter()
            _step_mv(wis, x, xd, xs, out, *r)
            took[r].append(time.perf_counter() - t)
    print(f"{path}: {len(wis)} q4_0 x16 matrices in step order, {nbytes / 1e6:.0f} MB")
    for nt in (1, 2):
        w, h = (nbytes / np.median(took[nt, form]) / 1e9 for form in (0, 1))
        print(f"  {nt} thread(s): words {w:5.1f} GB/s, halves {h:5.1f} GB/s; halves / words "
              f"{h / w:.2f}x")
    print(f"(wall time, medians of {rounds}; load average {os.getloadavg()[0]:.1f})")


def prefill(rounds: int, T: int) -> None:
    """The --prefill table (the module docstring)."""
    from edgellm.kernels import registry

    numba.set_num_threads(1)
    mm = registry.X16["q4_0"]["mm"]
    count = 20_000_000
    _peak(count)
    best = 1e9
    for _ in range(5):  # CPU time: the machine may be shared
        t = time.process_time()
        _peak(count)
        best = min(best, time.process_time() - t)
    peak = count * CHAINS / best
    rng = np.random.default_rng(0)
    shapes = {"q/k/v/o 2048x2048": (2048, 2048, 4), "gate/up 8192x2048": (8192, 2048, 2),
              "down 2048x8192": (2048, 8192, 1)}
    runs = {}
    for name, (N, K, _) in shapes.items():
        nb = K // 32
        w = rng.integers(0, 256, (N, nb * 18), dtype=np.uint8)
        w.reshape(N, nb, 18)[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        wi = to_x16(w, "q4_0")
        xd = np.full((T, nb), 1e-4, np.float32)
        xs = np.zeros((T, nb), np.int32)
        out = np.zeros((T, N), np.float32)
        for act, lim in ((np.int16, 32767), (np.int8, 127)):
            xq = rng.integers(-lim, lim + 1, (T, K)).astype(act)
            mm(wi, xq, xd, xs, xd, out, T)
            runs[name, np.dtype(act).name] = (wi, xq, xd, xs, out)
    took = {k: [] for k in runs}
    for _ in range(rounds):
        for k, (wi, xq, xd, xs, out) in runs.items():
            t = time.process_time()
            mm(wi, xq, xd, xs, xd, out, T)
            took[k].append(time.process_time() - t)
    print(f"vpdpwssd peak, one core: {peak / 1e9:.2f} G/s (vpdpbusd's is the same)")
    per = {"int16": 0.0, "int8": 0.0}
    for (name, act), v in took.items():
        N, K, count_ = shapes[name]
        t = float(np.median(v))
        per[act] += 24 * count_ * t / T
        dots = N * K * T / 64 * (2 if act == "int16" else 1)
        print(f"  {name:18s} {act:5s}: {t / T * 1e6:6.1f} us a token, "
              f"{dots / t / 1e9:4.2f} G dot instructions/s = {dots / t / peak:4.0%} of the peak")
    print("  the 24 layers' matrices: " + ", ".join(
        f"{a} {1 / s:5.1f} tokens/s" for a, s in per.items())
          + f" (CPU time; load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=184320)  # 30 layers' rows of 576 columns
    ap.add_argument("--cols", type=int, default=576)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--matvec", action="store_true", help="the x16 matvec table instead")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prefill", action="store_true", help="the x16 prefill table instead")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--step", metavar="MODEL", help="the step-order table of a q4_0 x16 file")
    args = ap.parse_args()
    if not VNNI:
        raise SystemExit("tile_bound: this CPU has no AVX-512 VNNI: no vpdpwssd to measure")
    if args.step:
        step(args.step, args.rounds * 3)
        return
    if args.matvec:
        matvec(args.rounds)
        return
    if args.prefill:
        prefill(args.rounds, args.tokens)
        return
    if args.rows % 16 or args.cols % 32:
        raise SystemExit("tile_bound: --rows must be a multiple of 16 and --cols of 32")
    count = 20_000_000
    alone = _best(3, _peak, count)
    peak, shared = count * CHAINS / alone, _best(3, _shared, count) / alone
    print(f"vpdpwssd peak, one core: {peak / 1e9:.2f} G/s; {CHAINS - 2} of them + 2 float FMAs "
          f"take {shared:.2f}x the time of {CHAINS} alone (0.88: other pipes, 1.0: shared)")
    rng = np.random.default_rng(0)
    nt = numba.get_num_threads()
    for act in (np.int16, np.int8):
        per_token = 16 if act == np.int16 else 8  # instructions a group-block and token
        for where, rows, threads in (("L2", 1536, 1), ("memory", args.rows, nt)):
            wi = _matrix(rows, args.cols, rng)
            nb = args.cols // 32
            lim = 127 if act == np.int8 else 3000
            xq = rng.integers(-lim, lim, (4, args.cols)).astype(act)
            xs = np.zeros((4, nb), np.int32)
            xd, xds = np.ones((4, nb), np.float32), np.ones((4, nb), np.float32)
            out = np.zeros((4, rows), np.float32)
            gb = rows // 16 * nb
            for n in (1, 2, 4):
                if where == "L2":
                    t = _best(args.reps, _tiles_here, wi, xq, xd, xs, xds, out, n, 100) / 100
                else:
                    t = _best(args.reps, _tiles, wi, xq, xd, xs, xds, out, n, threads)
                rate = gb * n * per_token / t
                print(f"  {np.dtype(act).name:5s} {where:6s} {threads} thread(s), {n} token(s): "
                      f"{t * 1e3:7.3f} ms, {rate / 1e9:5.2f} G dot instructions/s = "
                      f"{rate / (peak * threads):4.0%} of the peak x threads, "
                      f"{wi.nbytes / t / 1e9:5.1f} GB/s")


if __name__ == "__main__":
    main()
