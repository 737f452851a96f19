"""edgellm.modelfile.tokenizer_store and format version 2: the tokenizer stored compactly in the file.

The ground truth is the tokenizer built from the original tokenizer.json: the stored one
must serialize identically (ids, merges' ranks, added tokens, options) and give the same
ids and text. Version 1 files (tokenizer.json in the header) must still load.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

import edgellm
from converter.gguf_tokenizer import build_tokenizer
from edgellm.errors import FormatError, TokenizerError
from edgellm.modelfile import format as fmt
from edgellm.modelfile.tokenizer_store import build, decompress, store

FIXTURES = Path(__file__).parent / "fixtures"
TINY_LLAMA = FIXTURES / "tiny" / "llama"
TEXTS = ["Hello world", " leading and  double  spaces\n\nnewlines\t", "naïve café 日本語 🙂",
         "<|im_start|>user\nhi<|im_end|>", "x² + y³ = ½; 1,234,567.89", "<s>ǅ</s>", ""]


def rebuilt(text: str):
    stored, blob = store(text)
    return stored, build(stored["kind"], decompress(blob, stored["size"]))


def assert_same(text: str, tok) -> None:
    original = HFTokenizer.from_str(text)
    assert json.loads(tok.to_str()) == json.loads(original.to_str())
    for t in TEXTS:
        for special in (False, True):
            ids = original.encode(t, add_special_tokens=special).ids
            assert tok.encode(t, add_special_tokens=special).ids == ids, t
            assert tok.decode(ids) == original.decode(ids)


@pytest.mark.parametrize("path,kind", [
    (TINY_LLAMA / "tokenizer.json", "bpe"),               # byte-level BPE, 3 added tokens
    (FIXTURES / "smollm2" / "tokenizer.json", "bpe"),     # the real 49k vocabulary
    (FIXTURES / "embed" / "bert-tiny" / "tokenizer.json", "json"),  # WordPiece
])
def test_stored_tokenizer_is_the_same_tokenizer(path, kind):
    text = path.read_text()
    stored, tok = rebuilt(text)
    assert stored["kind"] == kind
    assert stored["tokens"] == HFTokenizer.from_str(text).get_vocab_size(with_added_tokens=True)
    assert_same(text, tok)


def test_smollm2_tables_are_a_seventh_of_the_json():
    text = (FIXTURES / "smollm2" / "tokenizer.json").read_text()
    stored, blob = store(text)
    assert len(blob) == stored["nbytes"] < len(text.encode()) / 7


def test_sentencepiece_tokenizer_rebuilt_from_gguf_round_trips():
    """The GGUF converter's SentencePiece form: byte fallback, "▁", control tokens."""
    d = json.loads((FIXTURES / "gguf" / "spm_bpe_tiny.json").read_text())
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": d["tokens"],
            "tokenizer.ggml.scores": d["scores"], "tokenizer.ggml.token_type": d["types"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}
    text, _ = build_tokenizer(meta, "spm.gguf")
    stored, tok = rebuilt(text)
    assert stored["kind"] == "bpe"
    assert_same(text, tok)
    for case in d["cases"][:20]:  # sentencepiece's own ids
        assert tok.encode(case["text"], add_special_tokens=False).ids == case["ids"]


def test_ids_with_a_gap_keep_the_json():
    doc = json.loads((TINY_LLAMA / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] += 7  # ids 0..n-2 and n+6: no dense table
    text = json.dumps(doc)
    stored, tok = rebuilt(text)
    assert stored["kind"] == "json"
    assert_same(text, tok)


def test_corrupt_tables_are_refused():
    stored, blob = store((TINY_LLAMA / "tokenizer.json").read_text())
    raw = decompress(blob, stored["size"])
    with pytest.raises(TokenizerError, match=r"stored tokenizer \(bpe\) is invalid"):
        build("bpe", raw[:-3])
    bad = bytearray(raw)
    struct.pack_into("<i", bad, 16 + 4 * (struct.unpack_from("<I", raw)[0] + 1), 10**6)
    with pytest.raises(TokenizerError, match="inconsistent"):
        build("bpe", bytes(bad))
    with pytest.raises(ValueError, match="expected"):
        decompress(blob, stored["size"] + 1)


# ------------------------------------------------------------------------ the packed file

def _header(path: Path) -> tuple[dict, int]:
    raw = path.read_bytes()
    hlen = struct.unpack_from("<Q", raw, 16)[0]
    return json.loads(raw[64:64 + hlen]), hlen


def _rewrite(src: Path, out: Path, header: dict, version: int = fmt.VERSION) -> Path:
    """src with another header (and preamble version), the data section moved along."""
    raw = src.read_bytes()
    old = fmt.align(64 + struct.unpack_from("<Q", raw, 16)[0])
    hb = json.dumps(header, ensure_ascii=False).encode()
    pad = fmt.align(64 + len(hb)) - 64 - len(hb)
    out.write_bytes(fmt.encode_preamble(hb, version) + hb + b"\0" * pad + raw[old:])
    return out


def test_converted_file_keeps_the_tokenizer_out_of_the_header(converted):
    path = converted("llama", "q8_0", layout="rows")  # a version 2 file
    header, hlen = _header(path)
    assert "json" not in header["tokenizer"] and header["tokenizer"]["stored"]["kind"] == "bpe"
    with fmt.PackedModel(path) as packed:
        assert packed.version == 2 and packed.has_tokenizer
        stored = packed.tokenizer_stored
        first = min(t.offset for t in packed.tensors.values())
        assert stored["offset"] == 0 and first == fmt.align(stored["nbytes"])
    original = (TINY_LLAMA / "tokenizer.json").read_text()
    with edgellm.load(path) as llm:
        assert_same(original, llm.tokenizer._tok)


def test_version_1_file_still_loads(converted, tmp_path):
    path = converted("llama", "q8_0")
    header, _ = _header(path)
    original = (TINY_LLAMA / "tokenizer.json").read_text()
    header["tokenizer"] = {"json": original, "config": header["tokenizer"]["config"]}
    old = _rewrite(path, tmp_path / "v1.edgellm", header, version=1)
    with edgellm.load(old) as v1, edgellm.load(path) as v2:
        assert v1.packed.version == 1 and v1.packed.tokenizer_stored is None
        assert v1.tokenizer.encode("Hello world") == v2.tokenizer.encode("Hello world")
        a = v1.generate("Hello", max_tokens=3, temperature=0)
        assert a == v2.generate("Hello", max_tokens=3, temperature=0)
        assert json.loads(v1.tokenizer.to_json()) == json.loads(v2.tokenizer.to_json())


@pytest.mark.parametrize("change,words", [
    (lambda st: st.update(offset=2**40), "runs past the end"),
    (lambda st: st.update(offset=64), "overlap"),
    (lambda st: st.update(offset=st["offset"] + 1), "not 64-byte aligned"),
    (lambda st: st.update(kind="zip"), "tokenizer.stored"),
    (lambda st: st.update(size=-1), "field 'size'"),
])
def test_bad_stored_fields_are_refused_at_open(converted, tmp_path, change, words):
    path = converted("llama", "q8_0")
    header, _ = _header(path)
    change(header["tokenizer"]["stored"])
    bad = _rewrite(path, tmp_path / "bad.edgellm", header)
    with pytest.raises(FormatError, match=words):
        fmt.PackedModel(bad)


def test_corrupt_stored_tokenizer_is_one_error(converted, tmp_path):
    path = converted("llama", "q8_0")
    bad = tmp_path / "bad.edgellm"
    shutil.copy(path, bad)
    with fmt.PackedModel(path) as packed:
        at = packed.data_start + packed.tokenizer_stored["nbytes"] // 2
    with open(bad, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    with edgellm.load(bad) as llm, pytest.raises(FormatError, match="stored tokenizer "
                                                 "checksum mismatch"):
        llm.tokenizer
