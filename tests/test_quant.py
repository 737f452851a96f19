"""Properties of the numpy reference quantizers (the oracle of every kernel)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from edgellm.errors import QuantizationError
from edgellm.modelfile import quant

BLOCKS = st.sampled_from(quant.BLOCK_SIZES)
finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)


def matrix(block, max_rows=4, max_blocks=3):
    return st.tuples(st.integers(1, max_rows), st.integers(1, max_blocks)).flatmap(
        lambda rn: arrays(np.float32, (rn[0], rn[1] * block), elements=finite))


@settings(max_examples=60, deadline=None)
@given(st.data(), BLOCKS)
def test_q8_0_error_at_most_half_a_step(data, block):
    x = data.draw(matrix(block))
    q = quant.quantize(x, "q8_0", block)
    y = quant.dequantize(q, "q8_0", x.shape, block)
    xb = x.reshape(x.shape[0], -1, block)
    d = np.abs(xb).max(-1, keepdims=True) / 127
    d16 = d.astype(np.float16).astype(np.float32)  # the stored scale
    # half a step of the exact scale, plus the f16 rounding of the scale times |q| <= 127
    bound = d / 2 + np.abs(d16 - d) * 127 + 1e-6 * np.abs(xb)
    assert (np.abs(y.reshape(xb.shape) - xb) <= bound + 1e-30).all()


@settings(max_examples=60, deadline=None)
@given(st.data(), BLOCKS, st.sampled_from(["q4_0", "q4_1"]))
def test_q4_round_trips_values_on_the_grid(data, block, kind):
    rows = data.draw(st.integers(1, 3))
    nb = data.draw(st.integers(1, 3))
    e = data.draw(st.integers(-8, 4))
    d = np.float32(2.0 ** e)  # exact in f16
    q = data.draw(arrays(np.int8, (rows, nb, block), elements=st.integers(0, 15)))
    if kind == "q4_0":
        q[..., 0] = 0  # -8 * d: the value of largest magnitude, as the quantizer expects
        x = d * (q.astype(np.float32) - 8)
    else:
        q[..., 0], q[..., 1] = 0, 15
        m = np.float32(data.draw(st.integers(-64, 64))) * d
        x = d * q.astype(np.float32) + m
    x = x.reshape(rows, nb * block)
    y = quant.dequantize(quant.quantize(x, kind, block), kind, x.shape, block)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("kind", quant.QUANTIZED)
@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 1e-30])
def test_zero_and_constant_blocks(kind, value):
    x = np.full((2, max(64, quant.TYPES[kind].blocks[0])), value, np.float32)
    y = quant.dequantize(quant.quantize(x, kind), kind, x.shape)
    assert np.isfinite(y).all()
    # 1e-30 is below f16's range: its scale flushes to zero, an absolute error of 1e-30
    np.testing.assert_allclose(y, x, rtol=1e-3, atol=max(abs(value) * 0.07, 1e-29))


@pytest.mark.parametrize("kind", quant.QUANTIZED)
def test_extreme_magnitudes_stay_finite(kind):
    reps = 16 * max(1, quant.TYPES[kind].blocks[0] // 32)  # a whole block of each type
    x = np.array([[6e4, -6e4] * reps, [1e-8, -1e-8] * reps], np.float32)
    y = quant.dequantize(quant.quantize(x, kind), kind, x.shape)
    assert np.isfinite(y).all()
    # 2- and 3-bit codes (-4..3 for q3_k) cannot hold +-x symmetrically
    assert np.abs(y[0] - x[0]).max() <= (0.15 if quant.TYPES[kind].bits >= 4 else 0.3) * 6e4


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_name_the_tensor(bad):
    x = np.ones((2, 32), np.float32)
    x[1, 3] = bad
    with pytest.raises(QuantizationError, match="model.layers.0.mlp.up_proj.weight"):
        quant.quantize(x, "q8_0", name="model.layers.0.mlp.up_proj.weight")


def test_layout_is_ggml_bytes():
    q = np.concatenate([np.arange(16), 15 - np.arange(16)]).astype(np.uint8)
    x = (q.astype(np.float32) - 8).reshape(1, 32)  # d = 1: x[0] = -8 has the largest magnitude
    raw = quant.quantize(x, "q4_0")
    assert raw.shape == (1, 18)
    assert raw[0, :2].view("<f2")[0] == 1.0
    # element j in the low nibble of byte j, element j + 16 in its high nibble
    np.testing.assert_array_equal(raw[0, 2:], q[:16] | (q[16:] << 4))


def test_matches_gguf_reference_bit_for_bit():
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as G

    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    x[0, :32] = 0
    for kind, g in (("q8_0", G.Q8_0), ("q4_0", G.Q4_0), ("q4_1", G.Q4_1)):
        np.testing.assert_array_equal(quant.quantize(x, kind), gguf_quants.quantize(x, g))
        np.testing.assert_array_equal(quant.dequantize(quant.quantize(x, kind), kind, x.shape),
                                      gguf_quants.dequantize(quant.quantize(x, kind), g))


@pytest.mark.parametrize("kind,ratio", [("q8_0", 8.5 / 32), ("q4_0", 4.5 / 32),
                                        ("q4_1", 5 / 32)])
def test_bytes_per_weight(kind, ratio):
    assert quant.qtype(kind).nbytes((576, 1536)) == 576 * 1536 * 4 * ratio


def test_unknown_type_and_bad_shape():
    with pytest.raises(QuantizationError, match="unknown quantization type"):
        quant.qtype("q3_k_xl")
    with pytest.raises(QuantizationError, match="cannot be split into blocks of 32"):
        quant.quantize(np.ones((2, 40), np.float32), "q4_0", name="w")


def test_k_types_name_their_block_size():
    with pytest.raises(QuantizationError, match="cannot be split into blocks of 256"):
        quant.quantize(np.ones((2, 640), np.float32), "q4_k", name="w")
    with pytest.raises(QuantizationError, match="block size 64 is not one of"):
        quant.check_quantizable("w", (2, 512), 64, "q6_k")
