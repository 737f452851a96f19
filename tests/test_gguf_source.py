"""converter.gguf_source: GGUF files written here with gguf.GGUFWriter, and the real SmolLM2.

The small files are made the way llama.cpp's convert_hf_to_gguf.py makes them (its tensor
names, its metadata keys, its Q/K row permutation for llama), from the tiny HF checkpoints,
so reading them back must give the HF tensors again.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from converter import gguf_names
from converter.gguf_source import open_gguf
from edgellm.errors import SourceError, UnsupportedArchitectureError
from edgellm.modelfile import quant

try:
    from tests.realmodel import smollm2_gguf_path
except ImportError:  # tests/ itself on sys.path
    from realmodel import smollm2_gguf_path

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "tiny"
SMOLLM2 = FIXTURES / "smollm2"

# HF -> GGUF names as llama.cpp's converter writes them (independent of converter.gguf_names).
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
          "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf in GLOBAL:
        return GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{BLOCK[rest]}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, in numpy."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def read_safetensors(folder: Path) -> dict[str, np.ndarray]:
    """All tensors of a HF folder as float32 (bf16 included, which numpy cannot name)."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = raw[8 + n + a:8 + n + b]
            if info["dtype"] == "BF16":
                x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                x = np.frombuffer(buf, {"F32": np.float32, "F16": np.float16}[info["dtype"]])
            out[name] = x.astype(np.float32).reshape(info["shape"])
    return out


def tokenizer_meta(folder: Path) -> dict:
    """tokenizer.ggml.* of a byte-level BPE HF tokenizer, as llama.cpp's converter writes it."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for added in tok["added_tokens"]:
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] \
            else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return {"tokens": tokens, "types": [int(t) for t in types], "merges": merges}


def write_gguf(path: Path, arch: str, config: dict, weights: dict[str, np.ndarray],
               qtype=lambda name, w: QT.F32, permute: bool | None = None,
               tokenizer: Path | None = None, extra=None, skip_meta=(),
               extra_tensors=None) -> dict[str, np.ndarray]:
    """A GGUF of HF `weights` as llama.cpp writes it; returns each tensor's stored bytes."""
    w = gguf.GGUFWriter(str(path), arch)
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    kv = kv or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0)}
    meta = {
        f"{arch}.block_count": ("u32", config["num_hidden_layers"]),
        f"{arch}.context_length": ("u32", config["max_position_embeddings"]),
        f"{arch}.embedding_length": ("u32", config["hidden_size"]),
        f"{arch}.feed_forward_length": ("u32", config["intermediate_size"]),
        f"{arch}.attention.head_count": ("u32", heads),
        f"{arch}.attention.head_count_kv": ("u32", kv),
        f"{arch}.attention.key_length": ("u32", head_dim),
        f"{arch}.attention.value_length": ("u32", head_dim),
        f"{arch}.rope.dimension_count": ("u32", head_dim),
        f"{arch}.rope.freq_base": ("f32", rope["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": ("f32", config["rms_norm_eps"]),
        f"{arch}.vocab_size": ("u32", config["vocab_size"]),
        "tokenizer.ggml.bos_token_id": ("u32", config["bos_token_id"]),
        "tokenizer.ggml.eos_token_id": ("u32", config["eos_token_id"]),
        **(extra or {}),
    }
    for key, (kind, value) in meta.items():
        if key in skip_meta:
            continue
        {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string,
         "bool": w.add_bool}[kind](key, value)
    if tokenizer is not None:
        tm = tokenizer_meta(tokenizer)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tm["tokens"])
        w.add_token_types(tm["types"])
        w.add_token_merges(tm["merges"])
        w.add_chat_template((tokenizer / "chat_template.jinja").read_text())
    permute = arch in ("llama", "mistral") if permute is None else permute
    stored = {}
    for hf, x in weights.items():
        name = gguf_name(hf)
        if permute and name.split(".")[-2] in ("attn_q", "attn_k"):
            x = llama_cpp_permute(x, heads if ".attn_q." in name else kv)
        t = qtype(name, x)
        data = x.astype(np.float32) if t == QT.F32 else x.astype(np.float16) if t == QT.F16 \
            else gguf.quants.quantize(x.astype(np.float32), t)
        w.add_tensor(name, data, raw_dtype=t)
        stored[name] = data
    for name, x in (extra_tensors or {}).items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def tiny(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    folder = TINY / name
    return json.loads((folder / "config.json").read_text()), read_safetensors(folder)


def by_name(source) -> dict:
    return {t.name: t for t in source.tensors()}


# ---------------------------------------------------------------- float and q8/q4 round trips

@pytest.mark.parametrize("fixture,arch", [("llama", "llama"), ("qwen2", "qwen2"),
                                          ("qwen3", "qwen3"), ("mistral-swa", "llama")])
def test_f32_gguf_gives_back_the_hf_tensors_exactly(tmp_path, fixture, arch):
    config, weights = tiny(fixture)
    path = tmp_path / "m.gguf"
    write_gguf(path, arch, config, weights, tokenizer=TINY / fixture)
    src = open_gguf(path)
    tensors = by_name(src)
    assert set(tensors) == set(weights)
    for name, want in weights.items():
        t = tensors[name]
        assert t.shape == want.shape and t.dtype == "f32" and t.load_raw is None
        got = t.load()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert src.kind == "gguf" and src.path == str(path)
    assert src.tokenizer_json and src.chat_template == (TINY / fixture /
                                                         "chat_template.jinja").read_text()


def test_llama_qk_biases_are_unpermuted_too(tmp_path):
    config, weights = tiny("llama")
    rng = np.random.default_rng(2)
    for i in range(config["num_hidden_layers"]):
        for proj, rows in (("q", 64), ("k", 32), ("v", 32)):
            weights[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = \
                rng.standard_normal(rows).astype(np.float32)
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", config, weights)
    src = open_gguf(path)
    assert src.config["attention_bias"] is True
    tensors = by_name(src)
    for name, want in weights.items():
        np.testing.assert_array_equal(tensors[name].load(), want, err_msg=name)


@pytest.mark.parametrize("qname,qt", [("q8_0", QT.Q8_0), ("q4_0", QT.Q4_0), ("q4_1", QT.Q4_1)])
def test_block_quantized_tensors_come_as_raw_rows_in_hf_order(tmp_path, qname, qt):
    config, weights = tiny("llama")
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", config, weights,
               qtype=lambda name, w: qt if w.ndim == 2 else QT.F32)
    tensors = by_name(open_gguf(path))
    for name, hf in weights.items():
        t = tensors[name]
        if hf.ndim == 1:
            assert t.dtype == "f32" and t.load_raw is None
            continue
        # Rows move whole under the permutation: quantizing HF rows gives the same blocks.
        want_raw = gguf.quants.quantize(hf, qt)
        assert t.dtype == qname and t.shape == hf.shape
        raw = t.load_raw()
        assert raw.dtype == np.uint8 and raw.shape == (hf.shape[0], quant.qtype(qname).row_bytes(
            hf.shape[1]))
        np.testing.assert_array_equal(raw, want_raw, err_msg=name)
        np.testing.assert_array_equal(t.load(), gguf.quants.dequantize(want_raw, qt),
                                      err_msg=name)
        np.testing.assert_array_equal(t.load(), quant.dequantize(raw, qname, hf.shape))


def test_other_ggml_types_are_dequantized_with_gguf(tmp_path):
    # Width 256 so that k-quants fit; random bytes are valid blocks of every type.
    rng = np.random.default_rng(0)
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
              "intermediate_size": 256, "num_hidden_layers": 1, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-5, "vocab_size": 32, "bos_token_id": 1, "eos_token_id": 2}
    kinds = {"token_embd.weight": QT.Q6_K, "blk.0.attn_q.weight": QT.Q4_K,
             "blk.0.attn_k.weight": QT.Q5_K, "blk.0.attn_v.weight": QT.Q5_0,
             "blk.0.attn_output.weight": QT.BF16, "blk.0.ffn_gate.weight": QT.F16,
             "blk.0.ffn_up.weight": QT.Q5_1, "blk.0.ffn_down.weight": QT.Q2_K}
    shapes = {"model.embed_tokens.weight": (32, 256), "model.norm.weight": (256,)}
    for hf in BLOCK:
        if "proj" in hf and "weight" in hf and "norm" not in hf:
            shapes[f"model.layers.0.{hf}"] = (128 if hf[10] in "kv" else 256, 256)
        elif hf.endswith("layernorm.weight"):
            shapes[f"model.layers.0.{hf}"] = (256,)
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    path = tmp_path / "m.gguf"

    def qtype(name, w):
        return kinds.get(name, QT.F32)

    # K-quants cannot be quantized by gguf-py: store random blocks for them instead.
    original = gguf.quants.quantize

    def fake_quantize(x, t):
        if t in (QT.Q6_K, QT.Q4_K, QT.Q5_K, QT.Q2_K):
            block, size = gguf.GGML_QUANT_SIZES[t]
            raw = rng.integers(0, 256, (x.shape[0], x.shape[1] // block * size), dtype=np.uint8)
            # Finite f16 scales (d, dmin ~ 1/16) where each type keeps them.
            blocks = raw.reshape(x.shape[0], -1, size)
            if t == QT.Q6_K:
                blocks[..., -2:] = [0x00, 0x2C]
            elif t == QT.Q2_K:
                blocks[..., -4:] = [0x00, 0x2C, 0x00, 0x2C]
            else:
                blocks[..., :4] = [0x00, 0x2C, 0x00, 0x2C]
            return raw
        return original(x, t)

    gguf.quants.quantize = fake_quantize
    try:
        stored = write_gguf(path, "llama", config, weights, qtype=qtype)
    finally:
        gguf.quants.quantize = original
    tensors = by_name(open_gguf(path))
    heads = {"attn_q": 4, "attn_k": 2}
    for hf, w in weights.items():
        name = gguf_name(hf)
        t = tensors[hf]
        kind = kinds.get(name, QT.F32)
        assert t.dtype == {QT.F32: "f32", QT.F16: "f16"}.get(kind, kind.name.lower()), name
        # K-quants, q5_0, q5_1 are edgellm types now: their bytes are handed over raw too
        # (bf16 is still dequantized); load() gives gguf's dequantization either way
        raw = kind.name.lower() in quant.TYPES and quant.TYPES[kind.name.lower()].quantized
        assert (t.load_raw is not None) == raw and t.shape == w.shape, name
        want = gguf.quants.dequantize(stored[name], kind).reshape(w.shape)
        if name.split(".")[-2] in heads:  # undo the permutation independently
            rows = llama_cpp_permute(np.arange(w.shape[0]), heads[name.split(".")[-2]])
            unpermuted = np.empty_like(want)
            unpermuted[rows] = want
            want = unpermuted
        np.testing.assert_array_equal(t.load(), want, err_msg=name)


def test_llama3_rope_freqs_and_untied_head(tmp_path):
    config, weights = tiny("llama-bf16-sharded")
    rope = config["rope_parameters"]
    # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3.
    base, dim = rope["rope_theta"], config["head_dim"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wl = rope["original_max_position_embeddings"] / rope["low_freq_factor"]
    high_wl = rope["original_max_position_embeddings"] / rope["high_freq_factor"]
    factors = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wl:
            factors.append(1)
        elif wavelen > low_wl:
            factors.append(rope["factor"])
        else:
            smooth = (rope["original_max_position_embeddings"] / wavelen
                      - rope["low_freq_factor"]) / (rope["high_freq_factor"]
                                                    - rope["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", config, weights,
               extra_tensors={"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    src = open_gguf(path)
    got = src.config["rope_scaling"]
    assert got["rope_type"] == "llama3" and got["factor"] == rope["factor"]
    assert src.config["rope_parameters"]["rope_type"] == "llama3"
    # Any parameters reproducing the stored factors define the same model.
    again = gguf_names.llama3_factors(base, dim, got["factor"], got["low_freq_factor"],
                                      got["high_freq_factor"],
                                      got["original_max_position_embeddings"])
    np.testing.assert_allclose(again, factors, rtol=1e-5)
    assert src.config["tie_word_embeddings"] is False
    tensors = by_name(src)
    assert set(tensors) == set(weights) and "lm_head.weight" in tensors
    np.testing.assert_array_equal(tensors["lm_head.weight"].load(), weights["lm_head.weight"])


def test_llama3_rope_recovers_the_usual_parameters():
    want = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    freqs = gguf_names.llama3_factors(500000.0, 64, 32.0, 1.0, 4.0, 8192).astype(np.float32)
    got = gguf_names.llama3_rope_scaling(freqs.astype(np.float64), 500000.0, 64, None, "f")
    assert got == {"rope_type": "llama3", **want}


# ------------------------------------------------------------------------------ config

@pytest.mark.parametrize("fixture,arch", [("llama", "llama"), ("qwen2", "qwen2"),
                                          ("qwen3", "qwen3"), ("llama-bf16-sharded", "llama")])
def test_config_matches_the_hf_config(tmp_path, fixture, arch):
    config, weights = tiny(fixture)
    path = tmp_path / "m.gguf"
    write_gguf(path, arch, config, weights)
    got = open_gguf(path).config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "vocab_size",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "model_type"):
        assert got[key] == config[key], key
    assert got["head_dim"] == (config.get("head_dim")
                               or config["hidden_size"] // config["num_attention_heads"])
    assert got["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"], rel=1e-6)
    assert got["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert got["architectures"] == config["architectures"]


def test_sliding_window_and_rope_scaling_metadata(tmp_path):
    config, weights = tiny("mistral-swa")
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", config, weights,
               extra={"llama.attention.sliding_window": ("u32", 16),
                      "llama.rope.scaling.type": ("str", "linear"),
                      "llama.rope.scaling.factor": ("f32", 2.0)})
    got = open_gguf(path).config
    assert got["sliding_window"] == 16
    assert got["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert got["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}


def test_unpermute_order_inverts_llama_cpp_permute():
    rng = np.random.default_rng(1)
    for rows, heads, cols in [(64, 4, 8), (32, 2, 3), (576, 9, 5), (192, 3, 1), (8, 1, 2)]:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        order = gguf_names.unpermute_order(rows, heads)
        np.testing.assert_array_equal(llama_cpp_permute(w, heads)[order], w)
        raw = rng.integers(0, 256, (rows, 34), dtype=np.uint8)  # quantized rows move the same
        np.testing.assert_array_equal(llama_cpp_permute(raw, heads)[order], raw)
    # One head of dim 4: HF rows (a0, a1 | b0, b1) are stored interleaved (a0, b0, a1, b1).
    np.testing.assert_array_equal(gguf_names.unpermute_order(4, 1), [0, 2, 1, 3])
    with pytest.raises(ValueError):
        gguf_names.unpermute_order(10, 4)


# --------------------------------------------------------------------------- bad files

@pytest.fixture
def good_file(tmp_path) -> Path:
    config, weights = tiny("llama")
    path = tmp_path / "good.gguf"
    write_gguf(path, "llama", config, weights, tokenizer=TINY / "llama")
    return path


def assert_one_line_source_error(path: Path, match: str | None = None):
    with pytest.raises(SourceError, match=match) as e:
        open_gguf(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_bad_magic(good_file, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + good_file.read_bytes()[4:])
    assert_one_line_source_error(bad, "magic")


@pytest.mark.parametrize("keep", [0, 3, 10, 23, 40, 200, 3000, 20000, -1000, -1])
def test_truncated_files(good_file, tmp_path, keep):
    data = good_file.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:keep])
    if keep == -1:  # only the alignment padding after the last tensor may go
        pad = len(data) - len(data.rstrip(b"\0"))
        if pad:
            bad.write_bytes(data[:len(data) - pad])
            open_gguf(bad)
            bad.write_bytes(data[:len(data) - pad - 1])
    assert_one_line_source_error(bad)


def test_corrupt_counts_and_types(good_file, tmp_path):
    data = bytearray(good_file.read_bytes())
    bad = tmp_path / "bad.gguf"
    # A huge tensor count / metadata count: fails at the end of the file, not after 2**60 reads.
    for offset in (8, 16):
        corrupt = bytearray(data)
        corrupt[offset:offset + 8] = struct.pack("<Q", 1 << 60)
        bad.write_bytes(corrupt)
        assert_one_line_source_error(bad)
    # An array length far beyond the file.
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4  # value type, element type, then the length
    corrupt = bytearray(data)
    corrupt[at:at + 8] = struct.pack("<Q", 1 << 62)
    bad.write_bytes(corrupt)
    assert_one_line_source_error(bad)
    # An unknown tensor type.
    name = b"token_embd.weight"
    at = data.index(name) + len(name)
    (n_dims,) = struct.unpack("<I", data[at:at + 4])
    at += 4 + 8 * n_dims
    corrupt = bytearray(data)
    corrupt[at:at + 4] = struct.pack("<I", 250)
    bad.write_bytes(corrupt)
    assert_one_line_source_error(bad)
    # GGUF version 99.
    corrupt = bytearray(data)
    corrupt[4:8] = struct.pack("<I", 99)
    bad.write_bytes(corrupt)
    assert_one_line_source_error(bad, "version")


def test_missing_or_empty_paths(tmp_path):
    assert_one_line_source_error(tmp_path / "nope.gguf", "no such file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_one_line_source_error(empty)
    with pytest.raises(SourceError):
        open_gguf(tmp_path)


def test_unknown_architecture(tmp_path):
    config, weights = tiny("llama")
    path = tmp_path / "m.gguf"
    write_gguf(path, "gpt2", config, weights)
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'"):
        open_gguf(path)


def test_missing_and_mistyped_metadata(tmp_path):
    config, weights = tiny("llama")
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", config, weights, skip_meta=("llama.block_count",))
    assert_one_line_source_error(path, "llama.block_count is missing")
    write_gguf(path, "llama", config, weights,
               extra={"llama.feed_forward_length": ("str", "wide")})
    assert_one_line_source_error(path, "llama.feed_forward_length is 'wide', expected int")


def test_unknown_tensor_and_bad_head_split(tmp_path):
    config, weights = tiny("llama")
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", config, weights,
               extra_tensors={"blk.0.mystery.weight": np.zeros(4, np.float32)})
    assert_one_line_source_error(path, "blk.0.mystery.weight")
    # 3 heads of 16 cannot make the 64 rows of q_proj (nor the 32 of k_proj).
    write_gguf(path, "llama", config, weights, permute=False,
               extra={"llama.attention.head_count": ("u32", 3),
                      "llama.attention.head_count_kv": ("u32", 3)})
    assert_one_line_source_error(path, "rows cannot be split into 3 heads")


# ------------------------------------------------------------------------ the real SmolLM2

@pytest.fixture(scope="module")
def smollm2():
    return open_gguf(smollm2_gguf_path())


def test_smollm2_config(smollm2):
    hf = json.loads((SMOLLM2 / "config.json").read_text())
    got = smollm2.config
    assert got["num_hidden_layers"] == 30 and got["hidden_size"] == 576
    assert (got["num_attention_heads"], got["num_key_value_heads"]) == (9, 3)
    assert got["vocab_size"] == 49152 and got["tie_word_embeddings"] is True
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "max_position_embeddings", "vocab_size", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id", "attention_bias", "mlp_bias"):
        assert got[key] == hf[key], key
    assert got["rope_theta"] == hf["rope_parameters"]["rope_theta"]
    assert smollm2.generation_config == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_smollm2_tensors(smollm2):
    tensors = by_name(smollm2)
    assert len(tensors) == 2 + 30 * 9
    assert tensors["model.embed_tokens.weight"].dtype == "q8_0"
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == "q4_1"
    assert tensors["model.norm.weight"].dtype == "f32"
    reader = gguf.GGUFReader(smollm2_gguf_path())
    stored = {t.name: t for t in reader.tensors}
    for name, heads in (("attn_q", 9), ("attn_k", 3), ("attn_v", None)):
        t = tensors[f"model.layers.0.self_attn.{name[-1]}_proj.weight"]
        gguf_rows = np.asarray(stored[f"blk.0.{name}.weight"].data)
        raw = t.load_raw()
        if heads:  # HF row r sits at GGUF row llama_cpp_permute(arange)[r]
            np.testing.assert_array_equal(llama_cpp_permute(raw, heads), gguf_rows)
        else:
            np.testing.assert_array_equal(raw, gguf_rows)
        np.testing.assert_array_equal(t.load(), quant.dequantize(raw, "q4_1", t.shape))
        np.testing.assert_array_equal(t.load(), gguf.quants.dequantize(raw, QT.Q4_1))


def test_smollm2_weights_give_the_transformers_logits(smollm2):
    """A plain numpy float forward of the loaded weights matches transformers' logits.

    The fixture stores transformers' float16 logits of the GGUF model at a subset of the
    vocabulary (each position's top 8 plus random columns): wrong Q/K row order, a wrong
    norm or a transposed weight would miss them by whole units.
    """
    ref = np.load(FIXTURES / "gguf" / "smollm2_logits_subset.npz")
    w = {t.name: t.load() for t in smollm2.tensors()}
    logits = llama_forward(smollm2.config, w, ref["input_ids"])
    want = ref["logits"].astype(np.float32)
    got = logits[:, ref["columns"]]
    assert np.abs(got - want).max() < 0.05  # float16 storage of values up to ~40
    np.testing.assert_array_equal(logits.argmax(-1), ref["columns"][want.argmax(-1)])
    assert logits[-1].argmax() == ref["greedy_ids"][0]


def llama_forward(c: dict, w: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Logits [T, vocab] of a llama model, written as transformers computes it."""
    n, hd, h, kv = len(ids), c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["rms_norm_eps"]) * g

    inv = 1.0 / c["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv
    cos, sin = np.cos(np.tile(ang, 2))[:, None], np.sin(np.tile(ang, 2))[:, None]

    def rope(x):  # rotate_half form
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = norm(x, w[p + "input_layernorm.weight"])
        q = rope((y @ w[p + "self_attn.q_proj.weight"].T).reshape(n, h, hd))
        k = rope((y @ w[p + "self_attn.k_proj.weight"].T).reshape(n, kv, hd))
        v = (y @ w[p + "self_attn.v_proj.weight"].T).reshape(n, kv, hd)
        k, v = np.repeat(k, h // kv, 1), np.repeat(v, h // kv, 1)
        a = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(n, h * hd) @ w[
            p + "self_attn.o_proj.weight"].T
        y = norm(x, w[p + "post_attention_layernorm.weight"])
        g, u = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (norm(x, w["model.norm.weight"]) @ head.T).astype(np.float32)
