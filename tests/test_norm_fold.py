"""converter/norm_fold.py: folding RMSNorm weights into the q8_0 projections they feed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LLAMA_FAMILY, TINY, reference

import edgellm
from converter import norm_fold
from converter.hf_source import open_hf
from converter.pack import convert
from converter.searcher import searcher
from edgellm.modelfile.format import PackedModel


def _logits(path, ids):
    with edgellm.load(path, precise=True) as llm:
        return llm.logits(ids)


def _folded(path) -> int:
    with PackedModel(path) as p:
        return p.header["quantization"].get("norms_folded", 0)


@pytest.mark.parametrize("name", LLAMA_FAMILY)
def test_fold_is_exact_in_float(name, tmp_path, monkeypatch):
    """Folded (allowed for f32 here) and unfolded f32 files compute the same logits."""
    ids = reference(name)["input_ids"].reshape(-1)[:24]
    plain = tmp_path / "plain.edgellm"
    convert(open_hf(TINY / name), plain, "f32", progress=False)
    monkeypatch.setattr(norm_fold, "TYPES", frozenset({"f32"}))
    folded = tmp_path / "folded.edgellm"
    convert(open_hf(TINY / name), folded, "f32", progress=False)
    layers = open_hf(TINY / name).config["num_hidden_layers"]
    assert _folded(folded) == 2 * layers and _folded(plain) == 0
    norm = "model.layers.0.input_layernorm"
    g = next(t for t in open_hf(TINY / name).tensors() if t.name == norm + ".weight").load()
    with PackedModel(folded) as p:
        assert np.all(p.tensor(norm + ".weight").dequantize() == 1)
        # the gain is kept for LoRA at run time (lora/attach.py), named per projection
        np.testing.assert_array_equal(p.tensor(norm + ".folded_gain").data, g)
        gains = p.header["quantization"]["folded_gains"]
        assert len(gains) == 5 * layers
        assert gains["model.layers.0.self_attn.k_proj.weight"] == norm + ".folded_gain"
    a, b = _logits(plain, ids), _logits(folded, ids)
    assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())


def test_q8_0_folds_and_4_bit_does_not(tmp_path):
    src = open_hf(TINY / "llama")
    layers = src.config["num_hidden_layers"]
    for recipe, want in (("q8_0", 2 * layers), ("q4_0", 0), ("q4_0_mixed", 0), ("f16", 0)):
        out = tmp_path / f"{recipe}.edgellm"
        convert(open_hf(TINY / "llama"), out, recipe, progress=False)
        assert _folded(out) == want, recipe
    out = tmp_path / "off.edgellm"
    convert(src, out, "q8_0", progress=False, fold_norms=False)
    assert _folded(out) == 0


def test_calibrated_quantizer_does_not_fold(tmp_path):
    """Column weights measured on the unfolded model do not fit folded columns."""
    src = open_hf(TINY / "llama")
    name = "model.layers.0.self_attn.q_proj.weight"
    cols = next(t.shape[1] for t in src.tensors() if t.name == name)
    out = tmp_path / "calibrated.edgellm"
    convert(src, out, "q8_0", progress=False,
            quantize=searcher({name: np.ones(cols, np.float32)}))
    assert _folded(out) == 0
    out = tmp_path / "searched.edgellm"
    convert(open_hf(TINY / "llama"), out, "q8_0", progress=False, quantize=searcher())
    assert _folded(out) > 0


def test_folded_q8_0_matches_reference(converted):
    """The folded q8_0 file still follows transformers' logits (precise path)."""
    name = "llama"
    ref = reference(name)
    ids = ref["input_ids"].reshape(-1)
    got = _logits(converted(name, "q8_0"), ids)
    want = ref["logits"].reshape(got.shape)
    assert _folded(converted(name, "q8_0")) > 0
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95
