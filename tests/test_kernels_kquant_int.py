"""The integer-activation kernels of q5_0, q5_1, q4_k, q5_k, q6_k (kernels/kquant_int.py;
q5_0 and q5_1: their generated family, kernels/tiles.py)
against the float product of the same quantized activations, on raw random and adversarial
blocks (f16 scales at their extremes and zero, codes at their limits, all-zero blocks), int16
and int8 activations, decode rows and prefill tiles (four tokens, then the rest)."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_kquant import raw_blocks

from edgellm.kernels import act_quant, registry
from edgellm.modelfile import quant

INT_K = [n for n in quant.K_TYPES if quant.TYPES[n].int8_kernels]


def quantized(x: np.ndarray, dtype):
    T, K = x.shape
    xq = np.zeros((T, K), dtype)
    xd, xs, xds = (np.zeros((T, K // 32), dt) for dt in (np.float32, np.int32, np.float32))
    act_quant.quantize_rows(x, xq, xd, xs, xds, 0, T)
    return xq, xd, xs, xds


def test_the_int_types_are_the_expected_ones():
    assert INT_K == ["q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "iq4_nl"]
    assert set(INT_K) <= set(registry.INT8)


@pytest.mark.parametrize("dtype", [np.int16, np.int8])
@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("kind", INT_K)
def test_rows_and_tiles_match_the_quantized_product(kind, adversarial, dtype):
    B = quant.TYPES[kind].blocks[0]
    # 21 rows, K: two super-blocks, or 15 blocks of 32 (three steps of four and three alone)
    # T: tiles of 6 tokens (q6_k: 4), then 4, then 1
    N, K, T = 21, 512 if B == 256 else 480, 11
    rng = np.random.default_rng(5)
    raw = raw_blocks(kind, N * K // B, rng, adversarial).reshape(N, -1)
    raw.flags.writeable = False
    wd = quant.dequantize(raw, kind, (N, K)).astype(np.float64)
    assert np.isfinite(wd).all()
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[1, :64] *= 1e4  # a block far larger than the rest
    x[2, 32:64] = 0.0  # an all-zero activation block
    xq, xd, xs, xds = quantized(x, dtype)
    xr = (xq.astype(np.float64).reshape(T, K // 32, 32) * xd[..., None]).reshape(T, K)
    ref, scale = xr @ wd.T, np.abs(xr) @ np.abs(wd).T
    k = registry.INT8[kind]
    rows = np.full((1, N), np.nan, np.float32)
    k.rows(raw, B, xq, xd, xds, rows, 0, N)
    par = np.full((1, N), np.nan, np.float32)
    k.parallel(raw, B, xq, xd, xds, par)
    mm = np.full((T, N), np.nan, np.float32)
    k.matmul(raw, B, xq, xd, xs, xds, mm, T, 2)
    for got, want, s in ((rows, ref[:1], scale[:1]), (par, ref[:1], scale[:1]), (mm, ref, scale)):
        assert np.isfinite(got).all()
        assert (np.abs(got - want) <= 2e-6 * s + 1e-30).all()
    np.testing.assert_array_equal(rows, par)
    # a worker's range that starts off the row groups (q5's tiles of 8 rows, then one by one)
    part = np.full((1, N), np.nan, np.float32)
    k.rows(raw, B, xq, xd, xds, part, 3, N)
    assert np.isnan(part[0, :3]).all()
    assert (np.abs(part[0, 3:] - ref[0, 3:]) <= 2e-6 * scale[0, 3:] + 1e-30).all()
