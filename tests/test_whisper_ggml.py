"""scripts/whisper_ggml.py (whisper.cpp's model file from the CTranslate2 whisper-base, for
benchmarks/whisper_speed.py's whisper.cpp column), read back as whisper.cpp's loader reads
it: header, mel filters, vocabulary, and every tensor's name, shape, type and values
against the converter's own reading of the same model.bin."""

import importlib.util
import struct

import numpy as np
from conftest import FIXTURES
from realmodel import whisper_base_dir

from tokenizers import Tokenizer

from converter.ct2_source import open_ct2
from edgellm.audio.mel import mel_filters


def _script():
    path = FIXTURES.parent.parent / "scripts" / "whisper_ggml.py"
    spec = importlib.util.spec_from_file_location("whisper_ggml", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(path):
    """(hparams, filters, tokens, {name: (type, array)}) as whisper_model_load reads them."""
    buf = path.read_bytes()
    magic, *hparams = struct.unpack_from("<I11i", buf, 0)
    assert magic == 0x67676D6C
    n_mel, n_fft = struct.unpack_from("<2i", buf, 48)
    at = 56 + n_mel * n_fft * 4
    filters = np.frombuffer(buf, "<f4", n_mel * n_fft, 56).reshape(n_mel, n_fft)
    (n,), at = struct.unpack_from("<i", buf, at), at + 4
    tokens = []
    for _ in range(n):
        (size,), at = struct.unpack_from("<i", buf, at), at + 4
        tokens.append(buf[at:at + size])
        at += size
    tensors = {}
    while at < len(buf):
        dims, length, kind = struct.unpack_from("<3i", buf, at)
        ne = struct.unpack_from(f"<{dims}i", buf, at + 12)
        at += 12 + 4 * dims
        name = buf[at:at + length].decode()
        at += length
        count = int(np.prod(ne))
        dtype = "<f2" if kind == 1 else "<f4"
        tensors[name] = (kind, np.frombuffer(buf, dtype, count, at).reshape(ne[::-1]))
        at += count * np.dtype(dtype).itemsize
    return hparams, filters, tokens, tensors


def test_the_ggml_file_holds_whisper_base_as_whisper_cpp_loads_it(tmp_path):
    src = whisper_base_dir()
    out = tmp_path / "ggml-base.bin"
    _script().write_ggml(src, out)
    hparams, filters, tokens, tensors = _read(out)
    # n_vocab, n_audio_ctx, state, heads, layers, n_text_ctx, state, heads, layers, n_mels, f16
    assert hparams == [51865, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1]
    np.testing.assert_array_equal(filters, mel_filters())
    assert len(tokens) == 50257 and tokens[50256] == b""  # openai's multilingual vocabulary
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    for i in range(0, 50256, 97):  # the tokens' bytes are what the tokenizer decodes them to
        text = tok.decode([i])
        if "\ufffd" not in text:
            assert tokens[i] == text.encode(), i
    # whisper.cpp's loader wants exactly these: 7 + 15 a encoder layer, 4 + 24 a decoder layer
    assert len(tensors) == 7 + 15 * 6 + 4 + 24 * 6
    assert tensors["encoder.conv1.weight"][1].shape == (512, 80, 3)
    assert tensors["encoder.conv1.bias"][1].shape == (512, 1)
    assert "decoder.blocks.0.attn.key.bias" not in tensors
    hf = {t.name: t for t in open_ct2(src).tensors()}
    pairs = {"decoder.blocks.2.attn.key.weight": "model.decoder.layers.2.self_attn.k_proj.weight",
             "decoder.blocks.2.attn.value.bias": "model.decoder.layers.2.self_attn.v_proj.bias",
             "decoder.blocks.5.cross_attn.key.weight":
                 "model.decoder.layers.5.encoder_attn.k_proj.weight",
             "decoder.blocks.5.cross_attn.value.weight":
                 "model.decoder.layers.5.encoder_attn.v_proj.weight",
             "encoder.blocks.3.attn.query.bias": "model.encoder.layers.3.self_attn.q_proj.bias",
             "encoder.blocks.3.mlp.2.weight": "model.encoder.layers.3.fc2.weight",
             "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
             "encoder.positional_embedding": "model.encoder.embed_positions.weight"}
    for name, hf_name in pairs.items():
        kind, got = tensors[name]
        assert kind == (1 if got.ndim == 2 and "positional" not in name else 0), name
        np.testing.assert_array_equal(got.astype(np.float32), hf[hf_name].load(), err_msg=name)
