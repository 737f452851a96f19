"""The x16 weight layout (modelfile/layout.py): convert-model writes q4_0, q4_1, q5_0, q5_1,
q8_0, q4_k and q6_k matrices interleaved 16 rows a group (a version 3 file, the same values bit for
bit, from safetensors and from GGUF); linear(), the embedding, the fused decode step, the
batched step and prefill read it in place and compute what the rows layout computes (bit
for bit where the arithmetic is the same: q4 one token a tile on AVX-512 VNNI); a
rows-layout file (version 2) still loads and generates alike."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TINY, reference
from reference_checks import decode_steps, greedy
from test_gguf_source import QT, tiny, write_gguf

import edgellm
from converter.gguf_source import open_gguf
from converter.pack import convert
from edgellm.errors import FormatError
from edgellm.kernels import linear as L
from edgellm.kernels.act_quant_k import ActK, quantize_k
from edgellm.kernels.kquant_kact import mv_kk
from edgellm.modelfile import format as fmt
from edgellm.modelfile import layout as layouts
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor
from edgellm.runtime import simd
from edgellm.step.batched import BatchDecoder

KINDS = layouts.X16_TYPES
Q4 = ("q4_0", "q4_1")  # blocks of 32, on x16.py's kernels
Q5 = layouts.X16_Q5  # the same, with each row's fifth bits
SB = layouts.X16_SB  # super-blocks of 256, on x16_k.py's
Q8 = ("q8_0",)  # blocks of 32 as i16 pairs (x16.py)
COLS = {"q4_0": 224, "q4_1": 224, "q5_0": 224, "q5_1": 224, "q8_0": 224, "q4_k": 512,
        "q6_k": 512}


def q_rows(kind: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32)
    w[:, :3] *= 9  # outliers: the scales differ between blocks
    return quant.quantize(w, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_x16_holds_the_rows_bytes_rearranged(kind):
    K, block = COLS[kind] - 64 * (kind in Q4 + Q5 + Q8), layouts.X16_BLOCK[kind]
    raw = q_rows(kind, 48, K)
    wi = layouts.to_x16(raw, kind)
    assert wi.shape == layouts.data_shape(kind, (48, K), block, layouts.X16) == \
        (3, 16 * raw.shape[1])
    np.testing.assert_array_equal(layouts.to_rows(wi, kind), raw)
    np.testing.assert_array_equal(
        quant.dequantize(layouts.to_rows(wi, kind), kind, (48, K)),
        quant.dequantize(raw, kind, (48, K)))
    with pytest.raises(ValueError, match="groups of 16"):
        layouts.to_x16(raw[:40], kind)


def test_which_tensors_fit_x16():
    assert layouts.fits_x16("q4_0", (32, 64), 32) and layouts.fits_x16("q4_1", (16, 32), 32)
    assert not layouts.fits_x16("q4_0", (24, 64), 32)  # rows not in groups of 16
    assert not layouts.fits_x16("q4_0", (32, 64), 64)  # blocks of 64
    assert layouts.fits_x16("q8_0", (32, 64), 32)
    assert not layouts.fits_x16("q8_0", (32, 64), 64)
    assert not layouts.fits_x16("f32", (32, 64), 32)
    assert layouts.fits_x16("q4_k", (32, 512), 256)
    assert not layouts.fits_x16("q4_k", (24, 512), 256)
    assert layouts.fits_x16("q6_k", (32, 512), 256)
    assert not layouts.fits_x16("q5_k", (32, 512), 256)
    assert layouts.fits_x16("q5_0", (32, 960), 32) and layouts.fits_x16("q5_1", (16, 64), 32)


@pytest.mark.parametrize("kind", Q5)
def test_q5_high_bits_are_permuted_for_the_chunks(kind):
    """A q5 group's block keeps each row's 32 fifth bits as one word, bit 8k + c holding
    column 8c + k's and bit 8k + 4 + c column 8c + 4 + k's (k, c < 4): chunk c's low
    (high) codes' fifth bits are then (word << (4 - c)) & 0x10101010 ((word >> c) &
    0x10101010), what the tiles OR into the masked nibbles."""
    raw = q_rows(kind, 16, 32)
    hdr = quant.TYPES[kind].header_bytes
    qh = np.unpackbits(raw[:, hdr:hdr + 4], axis=-1, bitorder="little")
    qs = raw[:, hdr + 4:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=1) | qh << 4  # [16 rows, 32] 5-bit
    wi = layouts.to_x16(raw, kind)[0]
    word = wi[16 * hdr:16 * hdr + 64].view(np.uint32)  # a row a lane
    chunks = wi[16 * hdr + 64:].reshape(4, 16, 4)  # chunk, lane, byte
    for c in range(4):
        v = chunks[c].copy().view(np.uint32)[:, 0]
        lo = (v & 0x0F0F0F0F) | (word << np.uint32(4 - c)) & np.uint32(0x10101010)
        hi = (v >> np.uint32(4)) & 0x0F0F0F0F | (word >> np.uint32(c)) & np.uint32(0x10101010)
        np.testing.assert_array_equal(lo.view(np.uint8).reshape(16, 4), codes[:, 8 * c:8 * c + 4])
        np.testing.assert_array_equal(hi.view(np.uint8).reshape(16, 4),
                                      codes[:, 8 * c + 4:8 * c + 8])


def _pair(kind, N=64, seed=0) -> tuple[Tensor, Tensor]:
    """The same matrix as rows and as x16 tensors (read-only, as the file's views)."""
    K, block = COLS[kind], layouts.X16_BLOCK[kind]
    raw = q_rows(kind, N, K, seed)
    wi = layouts.to_x16(raw, kind)
    for a in (raw, wi):
        a.flags.writeable = False
    return (Tensor("w", kind, (N, K), block, raw),
            Tensor("w", kind, (N, K), block, wi, layouts.X16))


@pytest.mark.parametrize("act", [np.int16, np.int8])
@pytest.mark.parametrize("kind", Q4 + Q5 + Q8)
def test_linear_on_x16_is_the_rows_single_token_result(kind, act):
    """Every token of a prefill (T = 7: tiles of 4, 2 and 1 tokens) gets the one-token
    result of the x16 kernels, which on VNNI is the rows layout's decode tile bit for bit
    (q4; q5's and q8_0's rows tiles add their floats in another order); both are close to
    the rows layout's prefill."""
    rows, x16 = _pair(kind)
    x = np.random.default_rng(3).standard_normal((7, 224)).astype(np.float32)
    x[2, :32] *= 1e3
    many = np.zeros((7, 64), np.float32)
    L.linear(x16, x, many, act_dtype=act)
    ref = np.zeros((7, 64), np.float32)
    L.linear(rows, x, ref, act_dtype=act)
    scale = np.abs(x) @ np.abs(rows.dequantize()).T
    assert (np.abs(many - ref) <= 2e-5 * scale).all()
    for t in range(7):
        one, single = np.zeros((1, 64), np.float32), np.zeros((1, 64), np.float32)
        L.linear(x16, x[t:t + 1], one, act_dtype=act)
        np.testing.assert_array_equal(one[0], many[t])  # whichever tile had the token
        L.linear(rows, x[t:t + 1], single, act_dtype=act)
        if simd.VNNI and kind in Q4:
            np.testing.assert_array_equal(one, single)
        else:
            assert (np.abs(one - single) <= 2e-5 * scale[t]).all()


@pytest.mark.parametrize("act", [np.int16, np.int8])
@pytest.mark.parametrize("kind", SB)
def test_linear_on_x16_k_quants(kind, act):
    """q4_k and q6_k in x16 (x16_k.py): every token of a prefill of 7 (tiles of 4 and 1)
    and a single token agree with the rows layout's kernels (one token: the decode step's
    on the same super-block activations within float rounding, the same integers in
    another float order; linear()'s on blocks of 32 within their rounding); int16 prefill
    on AVX-512 VNNI packs the rows' panels, so it is theirs bit for bit; where prefill
    takes super-block activations (int8, off VNNI) each token's result is the single
    token's bit for bit."""
    rows, x16 = _pair(kind)
    K = COLS[kind]
    x = np.random.default_rng(3).standard_normal((7, K)).astype(np.float32)
    x[2, :32] *= 1e3
    scale = np.abs(x) @ np.abs(rows.dequantize()).T
    many, ref = np.zeros((7, 64), np.float32), np.zeros((7, 64), np.float32)
    L.linear(x16, x, many, act_dtype=act)
    L.linear(rows, x, ref, act_dtype=act)
    panels = simd.VNNI and act == np.int16
    if panels:
        np.testing.assert_array_equal(many, ref)
    else:  # blocks of 32 (rows) against super-blocks of 256: the rounding of each
        assert (np.abs(many - ref) <= (2e-3 if act == np.int16 else 0.05) * scale).all()
    tol = 2e-3 if act == np.int16 else 0.05
    for t in range(7):
        one, single = np.zeros((1, 64), np.float32), np.zeros((1, 64), np.float32)
        L.linear(x16, x[t:t + 1], one, act_dtype=act)
        L.linear(rows, x[t:t + 1], single, act_dtype=act)  # blocks of 32
        if not panels:
            np.testing.assert_array_equal(one[0], many[t])  # whichever tile had the token
        assert (np.abs(one - single) <= tol * scale[t]).all()
        sb = quantize_k(x[t:t + 1], ActK(1, K, act))  # the rows' decode step's kernel
        kk = np.zeros((1, 64), np.float32)
        mv_kk(quant.TYPES[kind].code, rows.data, sb.xq, sb.xd, sb.xb, kk)
        assert (np.abs(one - kk) <= 2e-5 * scale[t]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_precise_linear_gemm_and_embedding_on_x16(kind):
    rows, x16 = _pair(kind)
    x = np.random.default_rng(4).standard_normal((5, COLS[kind])).astype(np.float32)
    wd = rows.dequantize().astype(np.float64)
    ref, scale = x.astype(np.float64) @ wd.T, np.abs(x) @ np.abs(wd).T
    for T in (1, 5):
        out = np.zeros((T, 64), np.float32)
        L.linear(x16, x[:T], out, precise=True)
        assert (np.abs(out - ref[:T]) <= 1e-5 * scale[:T]).all()
    out = np.zeros((5, 64), np.float32)
    L.gemm(x16, x, out)
    assert (np.abs(out - ref) <= 1e-5 * scale).all()
    ids = np.array([0, 17, 63, 17, 31])
    got, want = (np.zeros((5, COLS[kind]), np.float32) for _ in range(2))
    L.embedding(x16, ids, got)
    L.embedding(rows, ids, want)
    np.testing.assert_array_equal(got, want)  # d (q - 8), d q + m: the same roundings
    np.testing.assert_array_equal(x16.dequantize(), rows.dequantize())


def test_linear_refuses_an_x16_tensor_of_the_wrong_shape():
    rows, x16 = _pair("q4_0")
    bad = Tensor("w", "q4_0", (64, 224), 32, rows.data, layouts.X16)
    with pytest.raises(ValueError, match="must be uint8"):
        L.linear(bad, np.zeros((1, 224), np.float32), np.zeros((1, 64), np.float32))


# ---------------------------------------------------------------- the file

def _tables(path) -> tuple[int, dict]:
    p = fmt.PackedModel(path)
    try:
        return p.version, {n: (t, p.tensor(n).rows().copy()) for n, t in p.tensors.items()}
    finally:
        p.close()


@pytest.mark.parametrize("kind", Q4 + ("q5_0", "q8_0"))  # q4_k: test_fused_superblock.py
def test_convert_writes_x16_by_default_and_rows_on_request(kind, converted):
    v16, new = _tables(converted("llama", kind))
    v2, old = _tables(converted("llama", kind, layout="rows"))
    assert v16 == fmt.LAYOUT_VERSION and v2 == fmt.VERSION
    assert {n: t.layout for n, (t, _) in old.items()} == {n: "" for n in old}
    laid = [n for n, (t, _) in new.items() if t.layout]
    assert laid and all(new[n][0].type == kind for n in laid)
    for name, (info, data) in new.items():  # the same bytes, once put back in rows
        assert info.layout == (layouts.X16 if layouts.fits_x16(info.type, info.shape,
                                                                  info.block_size) else "")
        np.testing.assert_array_equal(data, old[name][1], err_msg=name)


def test_gguf_q4_0_converts_to_x16_with_the_same_bytes(tmp_path):
    """GGUF q4_0 blocks are copied, not requantized: the x16 file holds them bit for bit."""
    config, weights = tiny("llama")
    path = tmp_path / "m.gguf"
    stored = write_gguf(path, "llama", config, weights, tokenizer=TINY / "llama",
                        qtype=lambda name, w: QT.Q4_0 if w.ndim == 2 else QT.F32)
    out = tmp_path / "m.edgellm"
    convert(open_gguf(path), out, "keep", progress=False)
    p = fmt.PackedModel(out)
    try:
        assert p.version == fmt.LAYOUT_VERSION
        src = {t.name: t for t in open_gguf(path).tensors()}
        n = 0
        for name, info in p.tensors.items():
            if info.layout:
                n += 1
                np.testing.assert_array_equal(p.tensor(name).rows(), src[name].load_raw(),
                                              err_msg=name)
        assert n and stored
    finally:
        p.close()


def _rewrite_header(path, out, edit) -> None:
    """A copy of the file at `out` with its JSON header changed by edit(header), which
    must not lengthen it (the data section stays where it is)."""
    raw = path.read_bytes()
    magic, version, flags, hlen, _, _ = fmt.PREAMBLE.unpack(raw[:64])
    header = json.loads(raw[64:64 + hlen])
    edit(header)
    body = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    body += b" " * (hlen - len(body))
    assert len(body) == hlen
    out.write_bytes(fmt.encode_preamble(body, version) + body + raw[64 + hlen:])


def test_the_reader_checks_the_layout_field(converted, tmp_path):
    src = converted("llama", "q4_0")
    name = next(n for n, t in fmt.PackedModel(src).tensors.items() if t.layout)
    bad = tmp_path / "bad.edgellm"

    def unknown(h):
        h["tensors"][name]["layout"] = "x99"
    _rewrite_header(src, bad, unknown)
    with pytest.raises(FormatError, match="unknown layout"):
        fmt.PackedModel(bad)

    def norm(h):  # (its crc32's bytes for the field: the header keeps its length)
        norm_name = next(n for n, e in h["tensors"].items() if e["type"] == "f32")
        del h["tensors"][norm_name]["crc32"]
        h["tensors"][norm_name]["layout"] = "x16"
    _rewrite_header(src, bad, norm)
    with pytest.raises(FormatError, match="cannot be in layout x16"):
        fmt.PackedModel(bad)


# ---------------------------------------------------------------- the model

@pytest.mark.parametrize("kind", Q4 + ("q5_0", "q8_0"))
def test_x16_and_rows_files_decode_alike(kind, converted):
    """The fused step decodes token by token from an empty cache: bit for bit the rows
    file's logits on VNNI (q4: the same tile arithmetic), within float rounding elsewhere
    (and q5 and q8_0, whose rows tiles add in another order); greedy tokens the same; the precise
    path within its tolerance."""
    ids = [int(t) for t in reference("llama")["input_ids"]][:12]
    out = {}
    for layout in ("x16", "rows"):
        with edgellm.load(converted("llama", kind, layout=layout), threads=2) as llm:
            assert llm.model.fused is not None
            out[layout] = decode_steps(llm, ids), greedy(llm, ids[:4], 8)
        with edgellm.load(converted("llama", kind, layout=layout), precise=True) as llm:
            out[layout + " precise"] = decode_steps(llm, ids)
    (a, ga), (b, gb) = out["x16"], out["rows"]
    assert ga == gb
    if simd.VNNI and kind in Q4:
        np.testing.assert_array_equal(a, b)
    else:
        assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()
    assert np.abs(out["x16 precise"] - out["rows precise"]).max() < 1e-4


def test_the_batched_step_reads_x16_in_place(converted):
    """No interleaved copy for an x16 file (on every path), and each row's logits are the
    single step's bit for bit (its q4 matrices' tiles are the same). One thread: the
    portable child (test_portable.py) compiles this batched step too, and the parallel
    step's prange costs it as much again; test_batch_step.py runs x16 files on two."""
    ids = [int(t) for t in reference("llama")["input_ids"]][:6]
    with edgellm.load(converted("llama", "q4_0"), threads=1) as llm:
        m = llm.model
        stepper = BatchDecoder.build(m, [m.new_cache() for _ in range(2)])
        at, data = stepper.ilv
        x16 = m.fused.model_tables[1][:, 5] == 1
        assert x16.any() and (at[x16] >= 0).all() and stepper.copy_bytes == 0
        assert data is m.fused.blob
        single = decode_steps(llm, ids)
        for c in stepper.caches:
            c.reset()
        rows = np.stack([stepper.step([0, 1], [t, t])[0] for t in ids])
        np.testing.assert_array_equal(rows, single)


def test_info_says_which_layout(converted, capsys):
    from edgellm import cli

    with fmt.PackedModel(converted("llama", "q4_0")) as p:
        n = sum(1 for t in p.tensors.values() if t.layout)
    for layout, line in (("x16", f"format version 3, {n} matrices in the x16 layout"),
                         ("rows", f"format version 2, every matrix in rows ({n} would read "
                                  "faster in the x16 layout: convert the model again)")):
        assert cli.main(["info", str(converted("llama", "q4_0", layout=layout))]) == 0
        assert line in capsys.readouterr().out


def test_encoders_keep_rows(tmp_path):
    """BERT's (and Whisper's) matrices go through the encoders' float GEMM, which reads rows."""
    from test_embed import EMBED

    from converter.hf_source import open_hf

    out = tmp_path / "bert.edgellm"
    convert(open_hf(EMBED / "bert-tiny"), out, "q4_0", progress=False)
    with fmt.PackedModel(out) as p:
        assert p.version == fmt.VERSION
        assert not any(t.layout for t in p.tensors.values())
        assert any(t.type == "q4_0" for t in p.tensors.values())
