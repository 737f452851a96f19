"""Gemma 3 (gemma3_text) against transformers' outputs, a numpy reference of the block, and a
GGUF of the fixture written the way llama.cpp's converter writes Gemma 3."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from conftest import FIXTURES, TINY, reference
from gguf import GGMLQuantizationType as QT
from reference_checks import (
    check_f32_matches_transformers,
    check_precise_is_exact,
    decode_steps,
    top1_agreement,
)

import edgellm
from converter.gguf_source import open_gguf
from converter.hf_source import open_hf
from converter.pack import convert
from edgellm.arch.gemma3 import embed_scale, layer_rope_params
from edgellm.commands import info as info_cmd
from edgellm.memory_plan import plan
from edgellm.modelfile.config import ModelArgs
from edgellm.modelfile.format import PackedModel

NAME = "gemma3"


def fixture_weights() -> tuple[dict, dict[str, np.ndarray]]:
    src = open_hf(TINY / NAME)
    return dict(src.config), {t.name: t.load() for t in src.tensors()}


# ------------------------------------------------------------------ against transformers

def test_f32_matches_transformers(converted):
    check_f32_matches_transformers(converted(NAME, "f32"), NAME)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_precise_path_is_exact_on_quantized_weights(kind, converted, tmp_path):
    check_precise_is_exact(converted(NAME, kind), NAME, tmp_path)


def test_default_path_top1_agreement(converted, record_property):
    agree = top1_agreement(converted, NAME)
    record_property("top1", agree)
    assert agree["q8_0"] >= 0.8


# ------------------------------------------------------------- sliding window, memory

def test_sliding_layers_hold_only_the_window(converted):
    ref = reference(NAME)
    assert len(ref["input_ids"]) > 16
    for chunk in (64, 7):  # 7: the ring wraps inside the prefill too
        with edgellm.llm.LLM(converted(NAME, "f32"), chunk=chunk, kv_type="f32") as llm:
            m = llm.model
            kinds = m.args.layer_types
            assert kinds == ["sliding_attention", "full_attention", "sliding_attention",
                             "sliding_attention"]
            for layer, kind in zip(m.cache.layers, kinds, strict=True):
                assert (layer.cap, layer.window) == ((16, 16) if kind == "sliding_attention"
                                                     else (m.context, 0))
            assert np.abs(llm.logits(ref["input_ids"]) - ref["logits"]).max() < 1e-3
            assert all((layer.pos >= 0).sum() == 16 for layer in m.cache.layers if layer.window)
            assert np.abs(decode_steps(llm, ref["input_ids"]) - ref["logits"]).max() < 1e-3


def test_memory_plan_counts_the_window_saving(converted, capsys):
    path = converted(NAME, "q8_0")
    with PackedModel(path) as packed:
        args = ModelArgs.from_dict(packed.config)
        p = plan(packed, args, 256)
    from edgellm.cache.kv_types import DEFAULT_KV_TYPE, kv_row_bytes

    per_pos = 2 * args.num_key_value_heads * kv_row_bytes(DEFAULT_KV_TYPE, args.head_dim) + 8
    assert p.kv_cache == per_pos * (16 + 256 + 16 + 16)
    assert p.kv_cache_no_window == per_pos * 4 * 256
    with edgellm.llm.LLM(path, context=256) as llm:
        assert llm.model.cache.nbytes == p.kv_cache
    from edgellm.cli import main
    assert main(["info", str(path), "--ctx", "256"]) == 0
    out = capsys.readouterr().out
    assert "KV cache without sliding windows would be" in out
    assert info_cmd.describe(PackedModel(path), "256", "512MB")["memory"]["kv_cache"] \
        == p.kv_cache


# ------------------------------------------------------------ config forms and numerics

def test_transformers4_config_forms():
    """rope_theta / rope_local_base_freq / sliding_window_pattern (no layer_types) mean the
    same as transformers 5's per-layer-type rope_parameters."""
    config = json.loads((TINY / NAME / "config.json").read_text())
    new = ModelArgs.from_dict(config)
    old_cfg = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types",
                                                            "_sliding_window_pattern")}
    old_cfg.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2,
                   num_hidden_layers=4)
    old = ModelArgs.from_dict(old_cfg)
    assert old.layer_types == ["sliding_attention", "full_attention"] * 2
    for kind in ("sliding_attention", "full_attention"):
        assert layer_rope_params(old, kind)["rope_theta"] \
            == layer_rope_params(new, kind)["rope_theta"]
    assert layer_rope_params(new, "full_attention")["rope_theta"] == 1e6
    assert layer_rope_params(new, "sliding_attention")["rope_theta"] == 1e4
    default = ModelArgs.from_dict({**old_cfg, "sliding_window_pattern": None,
                                   "num_hidden_layers": 12})
    assert [i for i, t in enumerate(default.layer_types) if t == "full_attention"] == [5, 11]


def test_embedding_scale_follows_the_checkpoint_dtype():
    config = json.loads((TINY / NAME / "config.json").read_text())
    assert embed_scale(ModelArgs.from_dict(config)) == 8.0
    big = {**config, "hidden_size": 3072, "dtype": "bfloat16"}
    assert embed_scale(ModelArgs.from_dict(big)) == 55.5  # sqrt(3072) = 55.43 in bfloat16
    assert abs(embed_scale(ModelArgs.from_dict({**big, "dtype": "float32"})) - 55.4256) < 1e-4


def numpy_gemma3(config: dict, w: dict[str, np.ndarray], ids) -> np.ndarray:
    """Gemma 3 in float64 numpy, written from transformers' modeling_gemma3.py."""
    D, L = config["hidden_size"], config["num_hidden_layers"]
    H, KV, Dh = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, window = config["rms_norm_eps"], config["sliding_window"]
    cap_a, cap_f = config.get("attn_logit_softcapping"), config.get("final_logit_softcapping")
    T = len(ids)
    pos = np.arange(T)

    def norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + weight)

    def rope(x, theta):
        inv = 1.0 / theta ** (np.arange(0, Dh, 2) / Dh)
        ang = pos[:, None, None] * np.concatenate([inv, inv])[None, None, :]
        rot = np.concatenate([-x[..., Dh // 2:], x[..., :Dh // 2]], axis=-1)
        return x * np.cos(ang) + rot * np.sin(ang)

    x = w["model.embed_tokens.weight"][ids].astype(np.float64) * np.sqrt(D)
    for i in range(L):
        p = f"model.layers.{i}."
        kind = config["layer_types"][i]
        theta = config["rope_parameters"][kind]["rope_theta"]
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, Dh)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, Dh)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, Dh)
        q = rope(norm(q, w[p + "self_attn.q_norm.weight"]), theta)
        k = np.repeat(rope(norm(k, w[p + "self_attn.k_norm.weight"]), theta), H // KV, axis=1)
        v = np.repeat(v, H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * config["query_pre_attn_scalar"] ** -0.5
        if cap_a:
            s = cap_a * np.tanh(s / cap_a)
        see = pos[None, :] <= pos[:, None]
        if kind == "sliding_attention":
            see &= pos[:, None] - pos[None, :] < window
        s = np.where(see[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, H * Dh)
        a = a @ w[p + "self_attn.o_proj.weight"].T
        x = x + norm(a, w[p + "post_attention_layernorm.weight"])
        m = norm(x, w[p + "pre_feedforward_layernorm.weight"])
        g = m @ w[p + "mlp.gate_proj.weight"].T
        g = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        f = (g * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        x = x + norm(f, w[p + "post_feedforward_layernorm.weight"])
    logits = norm(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T
    return cap_f * np.tanh(logits / cap_f) if cap_f else logits


def test_softcapping(tmp_path):
    """attn/final logit soft-capping (null in the fixture): the numpy reference matches
    transformers without them, and the runtime matches the reference with them."""
    config, weights = fixture_weights()
    ref = reference(NAME)
    ids = ref["input_ids"]
    assert np.abs(numpy_gemma3(config, weights, ids) - ref["logits"]).max() < 1e-3
    src = open_hf(TINY / NAME)
    src.config = {**config, "attn_logit_softcapping": 1.5, "final_logit_softcapping": 4.0}
    convert(src, tmp_path / "capped.edgellm", "f32", progress=False)
    want = numpy_gemma3(src.config, weights, ids)
    assert np.abs(want - ref["logits"]).max() > 0.5  # the caps change the outputs
    assert np.abs(want).max() < 4.0
    with edgellm.load(tmp_path / "capped.edgellm", kv_type="f32") as llm:
        assert np.abs(llm.logits(ids) - want).max() < 1e-3
        assert np.abs(decode_steps(llm, ids) - want).max() < 1e-3


# -------------------------------------------------------------------------------- GGUF

GGUF_BLOCK = {
    "input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output", "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
    "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_BLOCK[rest]}.weight"


def _quantize(x: np.ndarray, t) -> np.ndarray:
    """gguf's quantization of x, or (types gguf only reads, such as IQ4_NL) edgellm's
    reference, which is llama-quantize's."""
    try:
        return gguf.quants.quantize(x, t)
    except NotImplementedError:
        from edgellm.modelfile import quant

        name = next(n for n, r in quant.TYPES.items() if r.ggml == t.name)
        return quant.quantize(x, name)


def write_gemma3_gguf(path, matrix_type=QT.F32) -> tuple[dict, dict]:
    """The fixture as llama.cpp's Gemma3Model writes it: norms stored as 1 + weight, a
    SentencePiece vocabulary with scores (the token embedding padded with zero rows to its
    700 tokens), no space prefix; the fixture's layer pattern as a boolean list."""
    config, weights = fixture_weights()
    spm = json.loads((FIXTURES / "gguf" / "spm_bpe_tiny.json").read_text())
    n_vocab = len(spm["tokens"])
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_freq_base(config["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_sliding_window(config["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
    w.add_tokenizer_model("llama")
    w.add_token_list(spm["tokens"])
    w.add_token_scores(spm["scores"])
    w.add_token_types(spm["types"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    for hf, x in weights.items():
        if hf == "model.embed_tokens.weight":
            x = np.concatenate([x, np.zeros((n_vocab - x.shape[0], x.shape[1]), np.float32)])
        if hf.endswith("norm.weight"):
            x = x + np.float32(1.0)
        t = matrix_type if x.ndim == 2 else QT.F32
        data = x if t == QT.F32 else _quantize(x, t)
        w.add_tensor(gguf_name(hf), data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return config, weights


def test_gguf_import(tmp_path):
    config, weights = write_gemma3_gguf(tmp_path / "g.gguf")
    src = open_gguf(tmp_path / "g.gguf")
    c = src.config
    assert c["model_type"] == "gemma3_text" and c["tie_word_embeddings"] is True
    for key in ("layer_types", "sliding_window", "head_dim", "query_pre_attn_scalar",
                "rope_parameters", "num_key_value_heads", "hidden_activation"):
        assert c[key] == config[key], key
    tensors = {t.name: t for t in src.tensors()}
    assert set(tensors) == set(weights)
    for name, want in weights.items():
        got = tensors[name].load()
        if name == "model.embed_tokens.weight":
            assert got.shape == (700, 64) and not got[512:].any()
            got = got[:512]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7, err_msg=name)

    # The vocabulary with scores: SentencePiece BPE without a space prefix.
    tok = edgellm.text.tokenizer.Tokenizer.from_json(src.tokenizer_json, src.tokenizer_config)
    spm = json.loads((FIXTURES / "gguf" / "spm_bpe_tiny.json").read_text())
    cases = [c for c in spm["cases"] if c["text"]]
    for case in cases:  # ids of llama.cpp with the space prefix: " " + text here
        assert tok.encode(" " + case["text"], add_special_tokens=False) == case["ids"]
    assert tok.encode("hi", add_special_tokens=True)[0] == 1

    # And the model runs as transformers' does (the padded vocabulary rows give 0).
    convert(src, tmp_path / "g.edgellm", "f32", progress=False)
    ref = reference(NAME)
    with edgellm.load(tmp_path / "g.edgellm") as llm:
        logits = llm.logits(ref["input_ids"])
        assert logits.shape == (40, 700) and not logits[:, 512:].any()
        assert np.abs(logits[:, :512] - ref["logits"]).max() < 1e-3


def test_gguf_q8_0_is_imported_losslessly(tmp_path, converted):
    write_gemma3_gguf(tmp_path / "q.gguf", QT.Q8_0)
    convert(open_gguf(tmp_path / "q.gguf"), tmp_path / "q.edgellm", "keep", progress=False)
    ids = reference(NAME)["input_ids"]
    with PackedModel(tmp_path / "q.edgellm") as p, PackedModel(converted(NAME, "q8_0")) as hf:
        assert p.config["query_pre_attn_scalar"] == 32
        for name, t in hf.tensors.items():
            if t.type == "q8_0" and name != "model.embed_tokens.weight":
                assert np.array_equal(p.tensor(name).data, hf.tensor(name).data), name
    with edgellm.load(tmp_path / "q.edgellm", precise=True) as a, \
            edgellm.load(converted(NAME, "q8_0"), precise=True) as b:
        assert np.abs(a.logits(ids)[:, :512] - b.logits(ids)).max() < 1e-4


def test_gguf_default_layer_pattern_and_27b_scale():
    from converter.gguf_names import hf_config
    meta = {"general.architecture": "gemma3", "gemma3.embedding_length": 5376,
            "gemma3.attention.head_count": 32, "gemma3.attention.head_count_kv": 16,
            "gemma3.attention.key_length": 128, "gemma3.feed_forward_length": 21504,
            "gemma3.block_count": 62, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
            "gemma3.context_length": 131072, "gemma3.rope.freq_base": 1e6,
            "gemma3.attention.sliding_window": 1024, "gemma3.rope.scaling.type": "linear",
            "gemma3.rope.scaling.factor": 8.0}
    c = hf_config(meta, {"token_embd.weight": (262208, 5376)}, "m.gguf")
    assert c["query_pre_attn_scalar"] == 168
    assert [i for i, t in enumerate(c["layer_types"]) if t == "full_attention"] == \
        list(range(5, 62, 6))
    assert c["rope_parameters"]["full_attention"] == {"rope_theta": 1e6, "rope_type": "linear",
                                                      "factor": 8.0}
    assert c["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
    args = ModelArgs.from_dict(c)
    assert args.layer_window(0) == 1024 and args.layer_window(5) == 0
