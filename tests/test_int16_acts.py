"""int16 activation blocks (the default decode step's): the quantizer against quant.py's
oracle bit for bit, the matrix-vector rows of every int8-kernel type against the float
product of the int16 activations, and the error they leave against float activations."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_linear import make_weight, make_x

from edgellm.kernels import act_quant, registry
from edgellm.kernels import linear as L
from edgellm.modelfile import quant

# the int8-kernel types stored at block sizes 32/64/128 (the K-quants and q5_0/q5_1, with their
# one fixed block size: test_kernels_kquant_int.py)
SIZED_INT8 = sorted(k for k in registry.INT8 if k in quant.SIZED_TYPES)


def quantize16(x: np.ndarray):
    T, K = x.shape
    xq = np.zeros((T, K), np.int16)
    xd, xs, xds = (np.zeros((T, K // 32), dt) for dt in (np.float32, np.int32, np.float32))
    act_quant.quantize_rows(x, xq, xd, xs, xds, 0, T)
    return xq, xd, xs, xds


def test_quantizer_is_the_oracle():
    x = make_x(3, 160)
    x[0, :32] = 0  # a zero block
    x[2, 32:64] = np.float32(32767 / 2) * np.sign(x[2, 32:64])  # ties at .5 after scaling
    x[1, 64:96] = 0
    x[1, 70] = np.float32(1e-38)  # a block's lone tiny value: d subnormal, 1 / d overflows
    xq, xd, xs, xds = quantize16(x)
    rq, rd, rs = quant.quantize_activations_q16(x)
    np.testing.assert_array_equal(xq, rq)
    np.testing.assert_array_equal(xd, rd)
    np.testing.assert_array_equal(xs, rs)
    np.testing.assert_allclose(xds, xd * xs, rtol=1e-6)


@pytest.mark.parametrize("block", quant.BLOCK_SIZES)
@pytest.mark.parametrize("kind", SIZED_INT8)
def test_rows_match_the_int16_product(kind, block):
    # 37 rows: row groups or 4-row tiles, then single rows; K = 7 blocks of 32 for B = 32
    # (the odd last block), 2 weight blocks otherwise
    N, K = 37, 224 if block == 32 else 2 * block
    w = make_weight(kind, N, K, block)
    x = make_x(1, K)
    xq, xd, xs, xds = quantize16(x)
    out = np.full((1, N), np.nan, np.float32)
    registry.INT8[kind].rows(w.data, block, xq, xd, xds, out, 0, N)
    wd = w.dequantize().astype(np.float64)
    xr = (xq.astype(np.float64).reshape(1, K // 32, 32) * xd[..., None]).reshape(1, K)
    ref, scale = xr @ wd.T, np.abs(xr) @ np.abs(wd).T
    assert (np.abs(out - ref) <= 2e-5 * scale).all()
    # and against float activations: ~1e-5 of the row's magnitude (int8 blocks: ~4e-3)
    exact = x.astype(np.float64) @ wd.T
    assert np.abs(out - exact).max() < 1e-4 * scale.max()


@pytest.mark.parametrize("T", [1, 6, 11, 21])  # decode; prefill's 8x6, 8x4 and 8x1 panel tiles
@pytest.mark.parametrize("kind", SIZED_INT8)
def test_linear_int16_is_close_to_float_activations(kind, T):
    N, K = 44, 256
    w = make_weight(kind, N, K, 32)
    x = make_x(T, K)
    wd = w.dequantize().astype(np.float64)
    exact, scale = x.astype(np.float64) @ wd.T, np.abs(x.astype(np.float64)) @ np.abs(wd).T
    errs = {}
    for dt in (np.int8, np.int16):
        out = np.full((T, N), np.nan, np.float32)
        L.linear(w, x, out, act_dtype=dt)
        errs[np.dtype(dt).name] = float((np.abs(out - exact) / scale).max())
    assert errs["int16"] < 5e-4, errs  # rounding to 1/65534 of a block's largest value
    assert errs["int16"] < errs["int8"] / 50, errs
    act = L.ActQ8(T, K, np.int16)
    shared = np.full((T, N), np.nan, np.float32)
    L.linear(w, x, shared, act=L.quantize_act(x, act))
    fresh = np.full((T, N), np.nan, np.float32)
    L.linear(w, x, fresh, act_dtype=np.int16)
    np.testing.assert_array_equal(shared, fresh)


def test_act_dtype_is_checked():
    with pytest.raises(ValueError, match="int8 or int16"):
        L.ActQ8(1, 32, np.int32)
