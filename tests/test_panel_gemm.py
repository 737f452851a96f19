"""The encoders' float panel GEMM (kernels/panel_gemm.py) against float64 numpy: every
count of rows past the last 6-row tile (0..5, the 2..5-row remainder tiles), weight rows
past the last 16-row panel, every stored type that has it."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.kernels.linear import gemm
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor

RTOL = 1e-5


@pytest.mark.parametrize("kind", ["f32", "q8_0", "q4_1"])
def test_gemm_matches_numpy_for_every_remainder(kind):
    N, K = 37, 96  # two 16-row panels and a tail of 5 rows
    rng = np.random.default_rng(0)
    data = quant.quantize(rng.standard_normal((N, K)).astype(np.float32), kind)
    w = Tensor("w", kind, (N, K), 32 if kind != "f32" else 0, data)
    wd = w.dequantize().astype(np.float64)
    for T in range(1, 14):  # 1..13 rows: every remainder of 6, with and without whole tiles
        x = rng.standard_normal((T, K)).astype(np.float32)
        out = np.full((T, N), np.nan, np.float32)
        gemm(w, x, out)
        ref = x.astype(np.float64) @ wd.T
        scale = np.abs(x.astype(np.float64)) @ np.abs(wd).T
        assert (np.abs(out - ref) <= RTOL * scale).all(), T
