"""Prefill's AMX tiles (kernels/amx.py) against the vpdpwssd panel tiles they replace.

Both sum the same integers exactly (each block's int16 x code products), so the two differ
only where LLVM contracts the float work differently: within 1e-6 of the largest output.
Random and adversarial inputs: int16 activations at their extremes (high byte -128),
q8_0 codes of every byte value (-128 too), all-zero blocks; token counts that are and are
not multiples of the 32 a pass takes (the last pass overlaps the one before it); row counts
with a last group of 8 and rows past it. Skipped where the CPU or OS has no AMX.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from edgellm.kernels import linear as L
from edgellm.kernels.amx import BX_BLOCK, MIN_TOKENS
from edgellm.kernels.matmul import panel_scratch, panel_tokens
from edgellm.kernels.tiles import TILES
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor
from edgellm.runtime import simd

PANEL_Q8_0, PANEL_Q4_0, PANEL_Q4_1 = (quant.TYPES[k].code for k in ("q8_0", "q4_0", "q4_1"))
pack_q8_0, pack_q4_0, pack_q4_1 = (TILES[c]["pack"] for c in (PANEL_Q8_0, PANEL_Q4_0, PANEL_Q4_1))
amx_tokens_q8_0, amx_tokens_q4_0, amx_tokens_q4_1 = (TILES[c]["amx"] for c in (PANEL_Q8_0,
                                                                               PANEL_Q4_0,
                                                                               PANEL_Q4_1))

pytestmark = pytest.mark.skipif(not simd.AMX, reason="no AMX-INT8 here (CPU, OS or EDGELLM_NO_AMX)")
KINDS = {"q8_0": PANEL_Q8_0, "q4_0": PANEL_Q4_0, "q4_1": PANEL_Q4_1}


@njit
def _pack(kind, w, i, panel, scales, g):
    if kind == PANEL_Q8_0:
        pack_q8_0(w, 32, i, panel, scales, g)
    elif kind == PANEL_Q4_0:
        pack_q4_0(w, 32, i, panel, scales, g)
    else:
        pack_q4_1(w, 32, i, panel, scales, g)


@njit
def amx_product(kind, w, xq, xd, xs, xds, out, T):
    """out[:T, :N // 16 * 16] on the AMX tiles."""
    K = xq.shape[1]
    panel = np.zeros((2, K // 32 * 256), np.uint8)
    scales = np.zeros((2, K // 32 * 16), np.float32)
    bx = np.zeros((1, K // 32 * BX_BLOCK), np.uint8)
    for i in range(0, w.shape[0] // 16 * 16, 16):
        _pack(kind, w, i, panel, scales, 0)
        _pack(kind, w, i + 8, panel, scales, 1)
        if kind == PANEL_Q8_0:
            amx_tokens_q8_0(panel, scales, xq, xd, xs, xds, out, bx, i, T)
        elif kind == PANEL_Q4_0:
            amx_tokens_q4_0(panel, scales, xq, xd, xs, xds, out, bx, i, T)
        else:
            amx_tokens_q4_1(panel, scales, xq, xd, xs, xds, out, bx, i, T)


@njit
def panel_product(kind, w, xq, xd, xs, xds, out, T, panel, scales):
    """The same columns on the vpdpwssd panel tiles."""
    for i in range(0, w.shape[0] // 16 * 16, 8):
        _pack(kind, w, i, panel, scales, 0)
        panel_tokens(kind, panel, scales, xq, xd, xs, xds, out, i, T)


def weights(kind, N, K, rng, adversarial=False):
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    w[:, :4] *= 8
    data = quant.quantize(w, kind, 32).copy()
    if adversarial:
        hdr = 2 if kind != "q4_1" else 4
        bb = data.shape[1] // (K // 32)
        blocks = data.reshape(N, K // 32, bb)
        codes = blocks[:, :, hdr:]
        codes[...] = rng.integers(0, 256, codes.shape, dtype=np.uint8)  # every byte value
        codes[:, 0, :] = 255 if kind != "q8_0" else 0x80  # the extreme code (q8_0: -128)
        codes[1::3, 1 % (K // 32), :] = 0  # all-zero blocks (q4: code 0, value -8d / m)
    data.flags.writeable = False
    return data


def activations(T, K, rng, adversarial=False):
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, 1] *= 20
    if adversarial:
        x[::2, ::32] = -1e4  # each block's extreme: -32767 (high byte -128)
        x[1::2, 5::32] = 3e4
        x[3, :] = 0.0  # an all-zero token
    act = L.ActQ8(T + 2, K, np.int16)
    L.quantize_act(x, act)
    return act


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("adversarial", [False, True])
@pytest.mark.parametrize("T", [MIN_TOKENS, 33, 47, 64, 100])
def test_amx_tiles_match_the_panel_tiles(kind, adversarial, T):
    rng = np.random.default_rng(T)
    N, K = 48, 96
    w = weights(kind, N, K, rng, adversarial)
    act = activations(T, K, rng, adversarial)
    args = (act.xq, act.xd, act.xs, act.xds)
    got = np.full((T, N), np.nan, np.float32)
    want = np.full((T, N), np.nan, np.float32)
    amx_product(KINDS[kind], w, *args, got, T)
    panel, scales = panel_scratch(K)
    panel_product(KINDS[kind], w, *args, want, T, panel, scales)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q5_0"])
@pytest.mark.parametrize("N", [32, 24, 45])
@pytest.mark.parametrize("T", [33, 56, 64])
def test_linear_on_amx_against_the_float64_product(kind, N, T):
    """linear() with int16 activations, T >= 32: AMX pairs of groups (each thread's rows),
    then a last group of 8 (N = 24) and rows past it (N = 45) on the other tiles. Tokens
    past the last 32 on the panel tiles (T = 33) or in a last AMX pass that overlaps the
    one before (T = 56: a remainder of at least matmul.AMX_TAIL)."""
    rng = np.random.default_rng(N + T)
    K = 256
    w32 = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    block = 32
    data = quant.quantize(w32, kind, block)
    data.flags.writeable = False
    w = Tensor("w", kind, (N, K), block, data)
    x = rng.standard_normal((T, K)).astype(np.float32)
    act = L.ActQ8(T, K, np.int16)
    out = np.full((T, N), np.nan, np.float32)
    L.linear(w, x, out, act=L.quantize_act(x, act))
    xq, xd, _ = quant.quantize_activations_q16(x)
    xr = (xq.astype(np.float64).reshape(T, K // 32, 32) * xd[..., None]).reshape(T, K)
    wd = w.dequantize().astype(np.float64)
    ref, scale = xr @ wd.T, np.abs(xr) @ np.abs(wd).T
    assert (np.abs(out - ref) <= 1e-5 * scale + 1e-30).all()
