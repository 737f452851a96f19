"""The decode step's attention alone against a streaming read of the same cache bytes.

At a model's shape (default SmolLM2-1.7B: 24 layers, 32 / 32 heads, head_dim 64), for each
cache type and position count: the CPU time of one token's attention over every layer
(decode_step._attend_group over each KV group, as the fused step runs it on one worker) and of a plain sum over
the same K and V bytes, and the ratio. Caches of random rows, one per layer (so the reads
come from memory, as in decode, not from a cache the last layer left warm).

    python benchmarks/attn_bound.py [--positions 128 512 2048] [--types f32 f16 q8_0]
                                    [--compare]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from edgellm.step import decode_step

_HEADS = hasattr(decode_step, "_attend_heads")  # else the one-group loop it replaced
_attend_heads = getattr(decode_step, "_attend_heads", None)
_attend_group = decode_step._attend_group


@numba.njit(fastmath=True, cache=False)
def _stream(a):
    """Sum of a [L, bytes / 4] float32: a streaming read, the bound."""
    s = np.float32(0.0)
    for l in range(a.shape[0]):
        for i in range(a.shape[1]):
            s += a[l, i]
    return s


def _layers_heads(q, kb, vb, K, V, cpos, p, scale, scores, stats, out, tile):
    """One token's attention over every layer's cache K, V [L, n, Hkv, width], as
    _attend_rows on one worker: every head in one pass."""
    for layer in range(K.shape[0]):
        _attend_heads(q, kb, vb, 0, K[layer], V[layer], cpos, 0, K.shape[2], 1, p, 0, scale,
                      np.float32(0.0), scores, stats, out, tile)


def _layers_groups(q, kb, vb, K, V, cpos, p, scale, scores, stats, out, tile):
    """The same, one KV group (here one head) at a time (the code _attend_heads replaced)."""
    for layer in range(K.shape[0]):
        for h in range(K.shape[2]):
            _attend_group(q[h:h + 1], 1, kb[h], vb[h], K[layer], V[layer], cpos, h, p, 0,
                          scale, np.float32(0.0), scores, stats, out, h, tile)


_attend_layers = numba.njit(_layers_heads if _HEADS else _layers_groups)
_groups_layers = numba.njit(_layers_groups)  # --compare: the head-at-a-time order


def _cache(kind, L, n, Hkv, Dh, rng):
    x = rng.standard_normal((L, n, Hkv, Dh)).astype(np.float32)
    if kind == "f32":
        return x
    if kind == "f16":
        return x.astype(np.float16).view(np.uint16)
    from edgellm.kernels.kv_store import encode_q8_0
    out = np.empty((L * n * Hkv, Dh // 32 * 34), np.uint8)
    encode_q8_0(x.reshape(-1, Dh), out)
    return out.reshape(L, n, Hkv, -1)


def _cpu(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--positions", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--types", nargs="+", default=["f32", "f16", "q8_0"])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--compare", action="store_true",
                    help="also time one KV group at a time over the cache (the order before "
                         "_attend_heads), alternating with the one-pass order")
    a = ap.parse_args(argv)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    L, H, Dh = a.layers, a.heads, a.dim
    q = rng.standard_normal((H, Dh)).astype(np.float32)
    kb, vb = q.copy(), q[::-1].copy()  # this token's k, v rows [Hkv, Dh]
    out = np.zeros(H * Dh, np.float32)
    tile = np.zeros((16, Dh), np.float32)
    scale = np.float32(Dh ** -0.5)
    print(f"{'type':5} {'pos':>5} {'MB':>7} {'attend ms':>10} {'GB/s':>6} "
          f"{'stream ms':>10} {'GB/s':>6} {'fraction':>8}"
          + (f" {'by head ms':>10} {'fraction':>8}" if a.compare else ""))
    for n in a.positions:
        scores = np.zeros((H, max(n, 1)), np.float32)
        stats = np.zeros((1, H), np.float32)
        cpos = np.arange(n, dtype=np.int32)
        for kind in a.types:
            K, V = _cache(kind, L, n, H, Dh, rng), _cache(kind, L, n, H, Dh, rng)
            flat = np.concatenate([K.reshape(L, -1).view(np.uint8),
                                   V.reshape(L, -1).view(np.uint8)], axis=1).view(np.float32)
            mb = flat.nbytes / 1e6
            run = lambda: _attend_layers(q, kb, vb, K, V, cpos, n, scale, scores, stats,
                                         out, tile)
            old = lambda: _groups_layers(q, kb, vb, K, V, cpos, n, scale, scores, stats,
                                         out, tile)
            run()
            _stream(flat)
            ta = ts = tg = float("inf")
            for _ in range(a.reps):  # alternating, so load drifts reach all alike
                ta = min(ta, _cpu(run, 1))
                ts = min(ts, _cpu(lambda: _stream(flat), 1))
                if a.compare:
                    tg = min(tg, _cpu(old, 1))
            print(f"{kind:5} {n:5d} {mb:7.1f} {ta * 1e3:10.2f} {mb / 1e3 / ta:6.1f} "
                  f"{ts * 1e3:10.2f} {mb / 1e3 / ts:6.1f} {ts / ta:8.2f}"
                  + (f" {tg * 1e3:10.2f} {ts / tg:8.2f}" if a.compare else ""), flush=True)


if __name__ == "__main__":
    main()
