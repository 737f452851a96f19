"""Phi-3 against transformers' outputs; partial rotary and sliding windows against a numpy
reference of transformers' Phi3 block."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY, reference
from reference_checks import (
    check_f32_matches_transformers,
    check_precise_is_exact,
    decode_steps,
    top1_agreement,
)

import edgellm
import edgellm.arch.steps as steps_mod
from converter.hf_source import open_hf
from converter.pack import convert
from edgellm.arch.phi3 import head_permutation
from edgellm.errors import UnsupportedArchitectureError
from edgellm.modelfile.format import PackedModel

NAME = "phi3"


def test_f32_matches_transformers(converted):
    check_f32_matches_transformers(converted(NAME, "f32"), NAME)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_precise_path_is_exact_on_quantized_weights(kind, converted, tmp_path):
    check_precise_is_exact(converted(NAME, kind), NAME, tmp_path)


def test_default_path_top1_agreement(converted, record_property):
    agree = top1_agreement(converted, NAME)
    record_property("top1", agree)
    assert agree["q8_0"] >= 0.8


def test_projections_stay_fused(converted, monkeypatch):
    """The file keeps qkv_proj and gate_up_proj; a decode step makes one linear call each."""
    path = converted(NAME, "q4_0")
    with PackedModel(path) as p:
        names = set(p.tensors)
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in names)
    calls = []
    real = steps_mod.linear
    monkeypatch.setattr(steps_mod, "linear", lambda w, *a, **k: (calls.append(w.name),
                                                                  real(w, *a, **k)))
    with edgellm.load(path, fused=False) as llm:  # the per-operation path's linear calls
        llm.model.forward([5], want="last")
    with edgellm.load(path) as llm:  # the fused step: each fused matrix one table entry
        fused = llm.model.fused
        offsets = [int(m[0]) for m in fused.mats]
        assert len(offsets) == len(set(offsets)) == 3 * 4 + 1
    assert sorted(calls) == sorted(f"model.layers.{i}.{n}" for i in range(3) for n in (
        "self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
        "mlp.down_proj.weight"))


def test_longrope_is_refused(tmp_path):
    src = open_hf(TINY / NAME)
    src.config = {**src.config, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8, "original_max_position_embeddings": 64}}
    convert(src, tmp_path / "long.edgellm", "f32", progress=False)
    with pytest.raises(UnsupportedArchitectureError, match="longrope"):
        edgellm.load(tmp_path / "long.edgellm")


def test_head_permutation_pairs():
    perm = head_permutation(16, 8)  # rot 8: pairs (0,4)..(3,7); pass-through 8..15
    assert sorted(perm) == list(range(16))
    assert [(perm[i], perm[i + 8]) for i in range(8)] == \
        [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]


def numpy_phi3(config: dict, w: dict[str, np.ndarray], ids, rot: int, window) -> np.ndarray:
    """Phi-3 in float64 numpy, written from transformers' modeling_phi3.py."""
    L, H, KV = config["num_hidden_layers"], config["num_attention_heads"], \
        config["num_key_value_heads"]
    Dh = config["hidden_size"] // H
    eps, theta = config["rms_norm_eps"], 10000.0
    T = len(ids)
    pos = np.arange(T)

    def norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def rope(x):
        inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
        ang = pos[:, None, None] * np.concatenate([inv, inv])[None, None, :]
        r, rest = x[..., :rot], x[..., rot:]
        half = np.concatenate([-r[..., rot // 2:], r[..., :rot // 2]], axis=-1)
        return np.concatenate([r * np.cos(ang) + half * np.sin(ang), rest], axis=-1)

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    for i in range(L):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        qkv = h @ w[p + "self_attn.qkv_proj.weight"].T
        q = rope(qkv[:, :H * Dh].reshape(T, H, Dh))
        k = rope(qkv[:, H * Dh:(H + KV) * Dh].reshape(T, KV, Dh))
        v = qkv[:, (H + KV) * Dh:].reshape(T, KV, Dh)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(Dh)
        see = pos[None, :] <= pos[:, None]
        if window:
            see &= pos[:, None] - pos[None, :] < window
        s = np.where(see[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, H * Dh)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        m = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = np.split(m @ w[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def phi3_weights():
    src = open_hf(TINY / NAME)
    return dict(src.config), {t.name: t.load() for t in src.tensors()}


def variant(tmp_path, **config) -> str:
    src = open_hf(TINY / NAME)
    src.config = {**src.config, **config}
    out = tmp_path / "variant.edgellm"
    convert(src, out, "f32", progress=False)
    return out


def test_numpy_reference_matches_transformers(phi3_weights):
    config, w = phi3_weights
    ref = reference(NAME)
    assert np.abs(numpy_phi3(config, w, ref["input_ids"], 16, None) - ref["logits"]).max() < 1e-3


@pytest.mark.parametrize("form", ["rope_parameters", "top_level"])
def test_partial_rotary_factor(form, phi3_weights, tmp_path):
    config, w = phi3_weights
    ids = reference(NAME)["input_ids"]
    if form == "rope_parameters":  # transformers 5
        change = {"rope_parameters": {**config["rope_parameters"], "partial_rotary_factor": 0.5}}
    else:  # transformers 4 spelling
        change = {"rope_parameters": None, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    want = numpy_phi3(config, w, ids, 8, None)
    assert np.abs(want - numpy_phi3(config, w, ids, 16, None)).max() > 0.1
    with edgellm.load(variant(tmp_path, **change), kv_type="f32") as llm:
        assert llm.model.rot == 8
        assert np.abs(llm.logits(ids) - want).max() < 1e-3
        assert np.abs(decode_steps(llm, ids) - want).max() < 1e-3


def test_partial_rotary_context_shift_re_ropes_keys(phi3_weights, tmp_path):
    """After a context shift, layer 0's keys (permuted, partially rotated) equal those of a
    fresh run over the kept tokens."""
    config, _ = phi3_weights
    path = variant(tmp_path, rope_parameters={**config["rope_parameters"],
                                              "partial_rotary_factor": 0.5})
    ids = reference(NAME)["input_ids"][:16]
    with edgellm.load(path, context=16, kv_type="f32") as llm:
        m = llm.model
        m.reset()
        m.forward(ids, want="none")
        assert m.cache.shift(1) == 6
        layer = m.cache.layers[0]
        n = m.cache.n_tokens
        shifted = layer.k[:n].copy()
        llm.logits(np.concatenate([ids[:4], ids[10:]]))
        np.testing.assert_allclose(shifted, layer.k[:n], atol=1e-5)


def test_sliding_window_applies_to_every_layer(phi3_weights, tmp_path):
    config, w = phi3_weights
    ids = reference(NAME)["input_ids"]
    want = numpy_phi3(config, w, ids, 16, 8)
    with edgellm.load(variant(tmp_path, sliding_window=8), kv_type="f32") as llm:
        assert [layer.cap for layer in llm.model.cache.layers] == [8, 8, 8]
        assert np.abs(llm.logits(ids) - want).max() < 1e-3
        assert np.abs(decode_steps(llm, ids) - want).max() < 1e-3
