"""The packed file: round trips over every fixture, and bad files rejected clearly."""

import json
import struct

import numpy as np
import pytest
from conftest import TINY, TINY_NAMES

from converter.hf_source import open_hf
from converter.norm_fold import fold_norms
from edgellm.errors import FormatError
from edgellm.modelfile import format as fmt
from edgellm.modelfile import quant


def same_tokenizer(a: str, b: str) -> bool:
    """Two tokenizer.json texts of one tokenizer (as `tokenizers` serializes them)."""
    import tokenizers

    return json.loads(tokenizers.Tokenizer.from_str(a).to_str()) == \
        json.loads(tokenizers.Tokenizer.from_str(b).to_str())


@pytest.mark.parametrize("name", TINY_NAMES)
def test_f32_round_trip_is_bit_exact(name, converted):
    src = {t.name: t for t in open_hf(TINY / name).tensors()}
    with fmt.PackedModel(converted(name, "f32")) as packed:
        assert packed.verify() == []
        config = json.loads((TINY / name / "config.json").read_text())
        assert packed.config == config
        assert same_tokenizer(packed.tokenizer_json, (TINY / name / "tokenizer.json").read_text())
        assert packed.chat_template == (TINY / name / "chat_template.jinja").read_text()
        for tname in packed.tensors:
            t = packed.tensor(tname)
            assert t.data.ctypes.data % 64 == 0  # zero-copy view, aligned
            np.testing.assert_array_equal(t.data, src[tname].load())  # bf16 upcast exactly
        names = set(packed.tensors)
        expected = set(src) - ({"lm_head.weight"} if config.get("tie_word_embeddings") else set())
        assert names == expected


@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("kind", quant.SIZED_TYPES)  # K types: tiny models' rows are < 256
def test_quantized_round_trip_equals_oracle(name, kind, converted):
    source = open_hf(TINY / name)
    with fmt.PackedModel(converted(name, kind)) as packed:
        # the oracle quantizes what the packer was to store: norms folded where it folds
        planned = [(t, t.name, packed.tensors[t.name].type) for t in source.tensors()
                   if t.name in packed.tensors]
        planned, folded = fold_norms(planned, source.config, 32)
        assert folded == packed.header["quantization"].get("norms_folded", 0)
        src = {name: t for t, name, _ in planned}
        for tname, info in packed.tensors.items():
            t = packed.tensor(tname)
            if info.type == kind:
                np.testing.assert_array_equal(t.rows(), quant.quantize(src[tname].load(), kind))
            else:
                assert info.type == "f32"


def _rewrite(path, out, mutate_header=None, mutate_bytes=None):
    raw = bytearray(path.read_bytes())
    hlen = struct.unpack_from("<Q", raw, 16)[0]
    header = json.loads(raw[64:64 + hlen])
    if mutate_header:
        mutate_header(header)
        new = json.dumps(header, separators=(",", ":")).encode()
        new = new.ljust(hlen)  # keep the data section where it is
        raw[64:64 + hlen] = new
        raw[0:64] = fmt.encode_preamble(bytes(new))
    if mutate_bytes:
        mutate_bytes(raw)
    out.write_bytes(bytes(raw))
    return out


def _first(header):
    return next(iter(header["tensors"].values()))


BAD_CASES = {
    "truncated": (None, lambda r: r.__delitem__(slice(len(r) - 100, None)), "runs past the end"),
    "wrong magic": (None, lambda r: r.__setitem__(slice(0, 8), b"GGUF\0\0\0\0"), "wrong magic"),
    "header bit flip": (None, lambda r: r.__setitem__(100, r[100] ^ 1), "checksum"),
    "offset past end": (lambda h: _first(h).__setitem__("offset", 1 << 40), None, "past the end"),
    "misaligned": (lambda h: _first(h).__setitem__("offset", 3), None, "aligned"),
    "lying size": (lambda h: _first(h).__setitem__("nbytes", 4), None, "does not match"),
    "negative shape": (lambda h: _first(h).__setitem__("shape", [-1, 64]), None, "shape"),
    "unknown type": (lambda h: _first(h).__setitem__("type", "q9_9"), None, "unknown type"),
    "table not object": (lambda h: h.__setitem__("tensors", [1, 2]), None, "not an object"),
    "overlap": (lambda h: [t.__setitem__("offset", 0) for t in h["tensors"].values()],
                None, "overlap"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_files_are_rejected_with_one_line(case, converted, tmp_path):
    mh, mb, message = BAD_CASES[case]
    path = _rewrite(converted("llama", "q8_0"), tmp_path / "bad.edgellm", mh, mb)
    with pytest.raises(FormatError, match=message) as e:
        fmt.PackedModel(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_verify_finds_a_corrupt_tensor(converted, tmp_path):
    src = converted("llama", "q8_0")
    with fmt.PackedModel(src) as p:
        info = p.tensors["model.layers.1.mlp.up_proj.weight"]
        at = p.data_start + info.offset + 7
    path = _rewrite(src, tmp_path / "c.edgellm", None, lambda r: r.__setitem__(at, r[at] ^ 0xFF))
    with fmt.PackedModel(path) as p:  # opening stays O(1): only the header is checked
        assert p.verify() == ["model.layers.1.mlp.up_proj.weight"]


def test_empty_and_tiny_files(tmp_path):
    for size in (0, 10, 63):
        p = tmp_path / f"f{size}"
        p.write_bytes(b"\0" * size)
        with pytest.raises(FormatError, match="truncated|magic"):
            fmt.PackedModel(p)
