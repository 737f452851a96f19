"""iq4_nl (ggml's IQ4_NL: blocks of 32, value d * IQ4_NL_VALUES[q]), the type added through
its quant.TYPES row and one RECIPES line: its reference against llama.cpp's bytes, GGUF
IQ4_NL files kept as they are and generating what their dequantized f32 twin generates, and
convert-model --quant iq4_nl. Its kernels against the reference: the tests of the
one-block-size types (test_kernels_kquant.py, test_kernels_kquant_int.py) take it by
parameter."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from reference_checks import check_fused_equals_per_operation, dequantized_copy, greedy

import edgellm
from edgellm.modelfile import quant

gguf = pytest.importorskip("gguf")


def ggml_blocks() -> np.ndarray:
    """16 rows of 256: random, an all-zero block, a constant one, outliers, tiny values and
    small integers (ties between levels)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 256)).astype(np.float32) * 0.05
    x[0, :32] = 0.0
    x[1, :32] = 0.25
    x[2, ::5] *= 300
    x[3] *= 1e-7
    x[4, :64] = rng.integers(-3, 4, 64).astype(np.float32)
    return x


def test_quantize_is_llama_quantize():
    """The bytes of llama.cpp's quantize_iq4_nl without an importance matrix (what
    llama-quantize writes for IQ4_NL), taken from its build on these blocks."""
    raw = quant.quantize(ggml_blocks(), "iq4_nl")
    assert raw.shape == (16, 8 * 18)
    assert raw[0, :18].tolist() == [0, 0] + [0x88] * 16  # zero block: d 0, codes 8 (level 1)
    want = "87cddf95a02b8af5b76b9420bdd04dd3ae12b40c0c1288908f98ee7ee4638b38"
    assert hashlib.sha256(raw.tobytes()).hexdigest() == want


def test_dequantize_is_the_table():
    d = np.float16(0.5)
    raw = np.zeros((1, 18), np.uint8)
    raw[0, :2] = np.frombuffer(d.tobytes(), np.uint8)
    raw[0, 2:] = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)
    got = quant.dequantize(raw, "iq4_nl", (1, 32))[0]
    levels = np.asarray(quant.IQ4_NL_VALUES, np.float32)
    np.testing.assert_array_equal(got, 0.5 * np.concatenate([levels, levels[::-1]]))


def test_searched_quantizers_take_the_reference():
    """--quantizer search fits d q (+ m) codes: for a table type (and q5, the K-quants) it
    hands over the reference's bytes instead of codes of another layout."""
    from converter.searcher import searcher

    x = ggml_blocks()
    for kind in ("iq4_nl", "q5_0"):
        np.testing.assert_array_equal(searcher()(x, kind, 32, name="w"),
                                      quant.quantize(x, kind))


def test_gguf_iq4_nl_is_kept_and_generates_as_its_f32_twin(tmp_path):
    """A GGUF file of IQ4_NL matrices: convert-model's `keep` copies them byte for byte, the
    fused decode step runs them, and the model generates the tokens of the f32 file holding
    their dequantization (default int16 activations and precise)."""
    from test_arch_gemma3 import NAME, write_gemma3_gguf

    from converter.gguf_source import open_gguf
    from converter.pack import convert
    from edgellm.modelfile.format import PackedModel

    path = tmp_path / "iq4_nl.gguf"
    write_gemma3_gguf(path, gguf.GGMLQuantizationType.IQ4_NL)
    src = open_gguf(path)
    out = tmp_path / "iq4_nl.edgellm"
    convert(src, out, "keep", progress=False)
    raw = {t.name: t for t in src.tensors()}
    with PackedModel(out) as p:
        kept = [n for n, t in p.tensors.items() if t.type == "iq4_nl"]
        assert len(kept) >= 7
        for n in kept:
            np.testing.assert_array_equal(p.tensor(n).data, raw[n].load_raw())
    check_fused_equals_per_operation(out, NAME)
    twin = dequantized_copy(out, tmp_path / "twin.edgellm")
    prompt = [1, 5, 9, 17, 33]
    with edgellm.load(twin) as llm:
        want = greedy(llm, prompt, 12)
        logits = llm.logits(prompt)
    for precise in (False, True):
        with edgellm.load(out, precise=precise) as llm:
            assert greedy(llm, prompt, 12) == want, precise
            assert np.abs(llm.logits(prompt) - logits).max() < (1e-3 if precise else 2e-2)


def test_convert_model_quant_iq4_nl(tmp_path, converted):
    """convert-model --quant iq4_nl: the matrices in iq4_nl, and precise decoding equals the
    f32 forward on their dequantization."""
    from reference_checks import check_precise_is_exact

    from edgellm.modelfile.format import PackedModel

    path = converted("llama", "iq4_nl")
    with PackedModel(path) as p:
        types = {t.type for t in p.tensors.values()}
    assert "iq4_nl" in types
    check_precise_is_exact(path, "llama", tmp_path)
