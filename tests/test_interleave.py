"""The batched step's interleaved matrices (kernels/interleave.py): the layout holds every
code and scale of the file's rows; the tiles are close to the float64 product of the same
quantized activations (random and adversarial blocks, int16 and int8 activations, 1, 2 and
4 tokens, each token's result the same whichever tile had it), and the q4 tiles are the
single step's 8x1 tile bit for bit on AVX-512 VNNI; the batched step uses them."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import edgellm
from edgellm.kernels import act_quant
from edgellm.kernels import interleave as il
from edgellm.kernels import linear as L
from edgellm.kernels.interleave import ILV_BLOCK
from edgellm.kernels.tiles import TILES
from edgellm.modelfile import layout as layouts
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor
from edgellm.runtime import simd
from edgellm.step.batched import BatchDecoder

# the single step's row-group tiles ("g": q4's 8x1, q8_0's 4x1)
tile_q4_0_8x1, tile_q4_1_8x1, tile_q8_0_4x1 = (TILES[quant.TYPES[k].code]["g"]
                                               for k in ("q4_0", "q4_1", "q8_0"))

KINDS = ("q4_0", "q4_1", "q8_0")
Q5 = ("q5_0", "q5_1")  # tiles only from an x16 file (no copies of a rows file's: own rounding)


def q_rows(kind: str, N: int, K: int, rng, adversarial: bool) -> np.ndarray:
    """N rows of K columns of ggml blocks: random codes and f16 scales; adversarial: d at
    f16's largest and subnormal, zero scales, codes all at their top (q8_0: -128, the
    most negative), an all-zero block."""
    BB = quant.TYPES[kind].block_bytes(32)
    raw = rng.integers(0, 256, (N * K // 32, BB), dtype=np.uint8)
    nf = 2 if kind in ("q4_1", "q5_1") else 1
    sc = rng.uniform(-1, 1, (raw.shape[0], nf)).astype(np.float32)
    if adversarial:
        sc[0::4], sc[1::4], sc[2::4] = 65504.0 / 1024, 6e-8, 0.0
        raw[3::4, 2 * nf:] = 0x80 if kind == "q8_0" else 0xFF
    raw[:, :2 * nf] = sc.astype("<f2").view(np.uint8).reshape(-1, 2 * nf)
    if adversarial:
        raw[-1] = 0
    return raw.reshape(N, -1)


def activations(x: np.ndarray, dtype):
    T, K = x.shape
    xq = np.zeros((T, K), dtype)
    xd, xs, xds = (np.zeros((T, K // 32), d) for d in (np.float32, np.int32, np.float32))
    act_quant.quantize_rows(x, xq, xd, xs, xds, 0, T)
    return xq, xd, xs, xds


@njit
def _single(code, w, xq, xd, xds, out):
    """The single step's tiles: q4's 8x1, q8_0's 4x1."""
    for t in range(xq.shape[0]):
        for g in range(0, w.shape[0], 8):
            if code == 1:
                tile_q4_1_8x1(w, 32, g, xq, xd, xds, t, out)
            elif code == 0:
                tile_q4_0_8x1(w, 32, g, xq, xd, xds, t, out)
            else:
                tile_q8_0_4x1(w, 32, g, xq, xd, xds, t, out)
                tile_q8_0_4x1(w, 32, g + 4, xq, xd, xds, t, out)


CODE = {"q4_0": 0, "q4_1": 1, "q8_0": 8}


def _sixteen(kind: str, RT: int):
    """A kernel running itile_<kind>_16x<RT> over all groups and tokens (RT at a time)."""
    tile = TILES[quant.TYPES[kind].code][f"i{RT}"]

    @njit
    def run(wi, xq, xd, xs, xds, out):
        for t in range(0, xq.shape[0] - RT + 1, RT):
            for g in range(wi.shape[0]):
                tile(wi, g, xq, xd, xs, xds, t, out, 16 * g)
    return run


@pytest.mark.parametrize("kind", KINDS)
def test_layout_holds_the_rows_codes_and_scales(kind):
    N, K = 32, 96
    raw = q_rows(kind, N, K, np.random.default_rng(1), False)
    wi = il.interleave(raw, kind)
    nb, BB = K // 32, ILV_BLOCK[kind]
    assert wi.shape == (N // 16, nb * BB)
    blocks = wi.reshape(N // 16, nb, BB)
    ggml = raw.reshape(N, nb, -1)
    d = blocks[..., :32].copy().view(np.uint16).transpose(0, 2, 1).reshape(N, nb)
    np.testing.assert_array_equal(d, ggml[..., :2].copy().view(np.uint16)[..., 0])
    np.testing.assert_array_equal(layouts.to_rows(wi, kind), raw)
    if kind == "q8_0":  # chunk j: row l's codes at columns 2j, 2j + 1 in bytes 2l, 2l + 1
        codes = blocks[..., 32:].reshape(N // 16, nb, 16, 16, 2).transpose(0, 3, 1, 2, 4)
        np.testing.assert_array_equal(codes.reshape(N, nb, 32), ggml[..., 2:])
        np.testing.assert_array_equal(wi, layouts.to_x16(raw, kind))
        return
    # q4: the file's x16 layout, which either activation type reads (the int8 test)
    np.testing.assert_array_equal(wi, layouts.to_x16(raw, kind))
    if kind == "q4_1":
        m = blocks[..., 32:64].copy().view(np.uint16).transpose(0, 2, 1).reshape(N, nb)
        np.testing.assert_array_equal(m, ggml[..., 2:4].copy().view(np.uint16)[..., 0])


@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
def test_int8_activations_read_the_q4_chunks_as_quadruples(kind):
    """For int8 activations (vpdpbusd's quadruples): q4 chunk c's byte 4l + k holds row l's
    codes at columns 8c + k (low nibble) and 8c + 4 + k (high)."""
    N, K = 32, 96
    raw = q_rows(kind, N, K, np.random.default_rng(2), False)
    wi = il.interleave(raw, kind)
    nb, BB = K // 32, ILV_BLOCK[kind]
    blocks = wi.reshape(N // 16, nb, BB)
    ggml = raw.reshape(N, nb, -1)
    hdr = 64 if kind == "q4_1" else 32
    quads = blocks[..., hdr:].reshape(N // 16, nb, 4, 16, 4)  # g, b, c, l, k
    codes = np.stack([quads & 15, quads >> 4], axis=4)  # g, b, c, l, h, k: column 8c + 4h + k
    codes = codes.transpose(0, 3, 1, 2, 4, 5).reshape(N, nb, 32)
    qs = ggml[..., hdr // 16:hdr // 16 + 16]
    np.testing.assert_array_equal(codes, np.concatenate([qs & 15, qs >> 4], axis=-1))


def test_rows_not_in_groups_of_16_are_refused():
    with pytest.raises(ValueError, match="groups of 16"):
        il.interleave(np.zeros((24, 40), np.uint8), "q4_1")


@pytest.mark.parametrize("dtype", [np.int16, np.int8])
@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("kind", KINDS + Q5)
def test_tiles_match_the_product_and_the_q4_tiles_are_the_8x1_tiles(kind, adversarial, dtype):
    N, K, T = 48, 416, 4  # 13 blocks: the two block chains of unequal length
    rng = np.random.default_rng(7)
    raw = q_rows(kind, N, K, rng, adversarial)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[1, :64] *= 1e4  # a block far larger than the rest
    x[2, 32:64] = 0.0  # an all-zero activation block
    xq, xd, xs, xds = activations(x, dtype)
    xr = (xq.astype(np.float64).reshape(T, K // 32, 32) * xd[..., None]).reshape(T, K)
    wd = quant.dequantize(raw, kind, (N, K)).astype(np.float64)
    ref, scale = xr @ wd.T, np.abs(xr) @ np.abs(wd).T
    single = np.full((T, N), np.nan, np.float32)
    if kind in CODE:
        _single(CODE[kind], raw, xq, xd, xds, single)
    else:  # q5: the rows layout's one-token matvec (its tiles round in their own order)
        for t in range(T):
            L.linear(Tensor("w", kind, (N, K), 32, raw), x[t:t + 1], single[t:t + 1],
                     act_dtype=dtype)
    wi = il.interleave(raw, kind)
    xa = xq.astype(np.int16) if kind == "q8_0" else xq  # as x16.tile_acts gives q8_0 int8
    first = None
    for RT in (1, 2, 4):
        got = np.full((T, N), np.nan, np.float32)
        _sixteen(kind, RT)(wi, xa, xd, xs, xds, got)
        assert (np.abs(got - ref) <= 2e-6 * scale + 1e-30).all(), RT
        first = got if first is None else first
        np.testing.assert_array_equal(got, first, err_msg=f"RT={RT}")  # whichever tile
        if simd.VNNI and kind in ("q4_0", "q4_1"):  # the single step's results (q8_0, q5:
            np.testing.assert_array_equal(got, single, err_msg=f"RT={RT}")  # their order)
    assert (np.abs(single - ref) <= 2e-6 * scale + 1e-30).all()


@pytest.mark.parametrize("kind", KINDS)
def test_the_batched_step_reads_the_interleaved_copies(kind, converted):
    """Of a rows-layout file (an x16 file is read in place: test_layout.py)."""
    with edgellm.load(converted("llama", kind, layout="rows"), threads=2) as llm:
        m = llm.model
        stepper = BatchDecoder.build(m, [m.new_cache() for _ in range(2)])
        at, data = stepper.ilv
        mats = m.fused.model_tables[1]
        mine = [k for k in range(len(mats)) if mats[k, 3] == quant.TYPES[kind].code]
        assert mine
        if simd.VNNI:
            assert (at[mine] >= 0).all() and data.size > 0
        else:
            assert (at < 0).all() and data.size == 0


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q5_0", "q5_1"])
def test_int16_halves_and_pairs_are_the_int16_words_bit_for_bit(kind):
    """The q4 tiles on halves() (int16 activations split into a u8 and an s8 byte: VNNI
    only) and on pairs() (permuted within fours) compute the same integers as on the int16
    words, so the same floats: random codes and activations over the whole int16 range,
    -32768 and 32767 in every block, 13 blocks (two chains of unequal length). On VNNI the
    batched step takes halves, prefill pairs (decode, halves where x16.DECODE_HALVES); off
    VNNI on x86 prefill takes pairs (x16.PAIRS_OFF_VNNI), the others the words."""
    from edgellm.kernels import registry
    from edgellm.kernels.x16 import (DECODE_HALVES, PAIRS_OFF_VNNI, decode_acts, prefill_acts,
                                     tile_acts)

    N, K, T = 48, 416, 4
    rng = np.random.default_rng(11)
    raw = q_rows(kind, N, K, rng, adversarial=False)
    xq = rng.integers(-32768, 32768, (T, K)).astype(np.int16)
    xq[:, 0::32], xq[:, 1::32] = -32768, 32767
    xq[1, 64:96] = -32768  # a block all at the bottom, and one all at the top
    xq[2, 96:128] = 32767
    xd = rng.uniform(1e-6, 1e-3, (T, K // 32)).astype(np.float32)
    xs = xq.reshape(T, K // 32, 32).astype(np.int32).sum(-1).astype(np.int32)
    xds = (xd * xs).astype(np.float32)
    xh = np.zeros((T, 2 * K), np.uint8)
    il.halves(xq, xh)
    lo, hi = xh.reshape(T, K // 32, 2, 32)[:, :, 0], xh.reshape(T, K // 32, 2, 32)[:, :, 1]
    np.testing.assert_array_equal(hi.view(np.int8).astype(np.int32) * 256 + lo,
                                  xq.reshape(T, K // 32, 32))
    wi = layouts.to_x16(raw, kind)
    words = np.full((T, N), np.nan, np.float32)
    _sixteen(kind, 1)(wi, xq, xd, xs, xds, words)
    xp = np.zeros((T, K), np.uint16)
    il.pairs(xq, xp)
    np.testing.assert_array_equal(xp.view(np.int16).reshape(T, K // 32, 32),
                                  xq.reshape(T, K // 32, 32)[:, :, il.PAIR_PERM])
    forms = (("halves", xh), ("pairs", xp)) if simd.VNNI else (("pairs", xp),)
    for RT in (1, 2, 4):
        for form, xa in forms:
            got = np.full((T, N), np.nan, np.float32)
            _sixteen(kind, RT)(wi, xa, xd, xs, xds, got)
            np.testing.assert_array_equal(got.view(np.int32), words.view(np.int32),
                                          err_msg=f"{form} RT={RT}")
    code = quant.TYPES[kind].code

    @njit
    def acts(xq):  # as the batched step calls it: code a closure constant
        return tile_acts(code, xq)

    @njit
    def prefill(xq):  # as the x16 prefill calls it
        return prefill_acts(code, xq)
    @njit
    def decode(xq):  # as the x16 matvec calls it
        return decode_acts(code, xq)
    assert acts(xq).dtype == (np.uint8 if simd.VNNI else np.int16)
    assert prefill(xq).dtype == (np.uint16 if simd.VNNI or PAIRS_OFF_VNNI else np.int16)
    assert decode(xq).dtype == (np.uint8 if DECODE_HALVES else np.int16)
    for form in (acts, prefill, decode):  # int8 activations as they are, on every path
        assert form(xq.astype(np.int8)).dtype == np.int8
    x16 = registry.X16[kind]
    got = np.full((1, N), np.nan, np.float32)
    x16["mv_rows"](wi, xq[:1], xd[:1], xs[:1], xds[:1], got, 16, 48)
    np.testing.assert_array_equal(got[0, 16:].view(np.int32), words[0, 16:].view(np.int32))
    got = np.full((1, N), np.nan, np.float32)
    x16["mv"](wi, xq[1:2], xd[1:2], xs[1:2], xds[1:2], got)
    np.testing.assert_array_equal(got.view(np.int32), words[1:2].view(np.int32))
    got = np.full((T, N), np.nan, np.float32)
    x16["mm"](wi, xq, xd, xs, xds, got, T)
    np.testing.assert_array_equal(got.view(np.int32), words.view(np.int32))


def test_q8_0_int8_activations_reach_its_tiles_widened():
    """q8_0's tiles read i16 pairs (one layout, the file's, for both activation types):
    every path gives them int8 activations as the same integers in int16."""
    from edgellm.kernels.x16 import decode_acts, prefill_acts, tile_acts

    code = quant.TYPES["q8_0"].code

    @njit
    def forms(xq):  # code a closure constant, as the kernels call them
        return tile_acts(code, xq), prefill_acts(code, xq), decode_acts(code, xq)

    x8 = np.arange(-128, 128, dtype=np.int8).reshape(2, 128)
    for got in forms(x8):
        assert got.dtype == np.int16
        np.testing.assert_array_equal(got, x8)
    x16 = x8.astype(np.int16) * 200
    assert all(got is x16 or np.shares_memory(got, x16) for got in forms(x16))
