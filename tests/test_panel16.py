"""Prefill of q4_k, q5_k and q6_k on int16 activations (kernels/panel16.py on AVX-512 VNNI):
each output is the 8-row panels' (kernels/panel.py) bit for bit, for any token count.

A matrix's whole groups of 16 rows run on the 16-row panels and a further group of 8 on the
8-row ones, so a matrix whose rows 16..23 repeat rows 0..7 has both paths compute the same
dot products: their outputs must be equal, token by token, whatever tiles each token fell
in (token counts 1..20, and past a multiple of the 8-token tiles).

A CPU with AMX runs these panels too: for q4_k / q5_k they outrun kernels/amx.py's tiles at
every shape measured (docs/design-figures.md)."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_kquant import raw_blocks
from test_kernels_kquant_int import quantized

from edgellm.kernels import kquant_int, panel16, registry
from edgellm.runtime.simd import VNNI

KINDS = ["q4_k", "q5_k", "q6_k"]


def repeated(kind: str, K: int, rng, adversarial: bool) -> np.ndarray:
    """24 rows (+ 3 more for the one-row tiles): rows 16..23 repeat rows 0..7."""
    raw = raw_blocks(kind, 16 * K // 256, rng, adversarial).reshape(16, -1)
    tail = raw_blocks(kind, 3 * K // 256, rng, adversarial).reshape(3, -1)
    w = np.concatenate([raw, raw[:8], tail])
    w.flags.writeable = False
    return w


@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("kind", KINDS)
def test_16_row_panels_equal_the_8_row_panels(kind, adversarial):
    rng = np.random.default_rng(3)
    K = 512
    w = repeated(kind, K, rng, adversarial)
    mm = registry.INT8[kind].matmul
    for T in [*range(1, 21), 37]:
        x = rng.standard_normal((T, K)).astype(np.float32)
        x[0, :64] *= 1e4  # a block far larger than the rest
        xq, xd, xs, xds = quantized(x, np.int16)
        out = np.full((T, w.shape[0]), np.nan, np.float32)
        mm(w, 256, xq, xd, xs, xds, out, T, 1)
        assert np.isfinite(out).all()
        np.testing.assert_array_equal(out[:, 16:24], out[:, :8], err_msg=f"T={T}")


@pytest.mark.skipif(not VNNI, reason="the 16-row panels run on AVX-512 VNNI only")
@pytest.mark.parametrize("dtype, rows", [(np.int16, 16), (np.int8, 0)])
def test_int16_activations_take_the_16_row_panels(dtype, rows):
    """k16_rows does whole groups of 16 for int16 activations, nothing for int8 (q4_1's
    8-row panels on vpdpbusd)."""
    from numba import njit

    @njit
    def done(w, xq, xd, xds, out):
        return panel16.k16_rows(kquant_int.Q4_K, w, xq, xd, xds, out, 0, 24, 3)

    rng = np.random.default_rng(0)
    w = repeated("q4_k", 256, rng, False)
    xq, xd, xs, xds = quantized(rng.standard_normal((3, 256)).astype(np.float32), dtype)
    out = np.zeros((3, w.shape[0]), np.float32)
    assert done(w, xq, xd, xds, out) == rows


@pytest.mark.skipif(not VNNI, reason="the 16-row panels run on AVX-512 VNNI only")
@pytest.mark.parametrize("kind", ["q4_k", "q6_k"])
def test_the_tile_is_vpdpwssd_on_broadcast_activations(kind):
    """The 8-token tile issues one vpdpwssd a chunk and token, its activations broadcast
    from memory ({1to16}), no register broadcasts of them and no widening."""
    from numba import njit, typeof

    tile = getattr(panel16, f"ktile16_{kind}_run")

    def probe(panel, scales, xq, xd, xds, out):
        tile(panel, scales, 0, xq, xd, xds, 0, out, 0)

    K = 64
    args = (np.zeros((1, K // 32 * panel16.BLOCK16), np.uint8),
            np.zeros((1, K // 32 * panel16.SCALES16), np.float32),
            np.zeros((8, K), np.int16), np.zeros((8, K // 32), np.float32),
            np.zeros((8, K // 32), np.float32), np.zeros((8, 16), np.float32))
    f = njit(probe)
    sig = tuple(typeof(a) for a in args)
    f.compile(sig)
    ops = [ln.split() for ln in f.inspect_asm(sig).splitlines() if ln.startswith("\t")]
    dots = [op for op in ops if op[0] == "vpdpwssd"]
    assert len(dots) >= 128 and all("{1to16}" in op[1] for op in dots)
    assert not [op for op in ops if op[0] in ("vpbroadcastq", "vpmovzxbw", "vpmaddwd")]
