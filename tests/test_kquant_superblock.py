"""Super-block activations for the K-quant matrices (kernels/act_quant_k.py, kquant_kact.py):
the quantizer against quant_k's oracle bit for bit, the decode rows of q4_k, q5_k and q6_k
against the float product of the same quantized activations (random and adversarial
blocks, int16 and int8), their error against float activations, and the checks made
before a kernel runs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from test_kernels_kquant import raw_blocks

from edgellm.kernels import act_quant_k, kquant_kact
from edgellm.modelfile import quant
from edgellm.modelfile.quant_k import quantize_activations_k

SB = ("q4_k", "q5_k", "q6_k")
DTYPES = [np.int16, np.int8]


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantizer_is_the_oracle(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 768)).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero super-block: scale 0, codes 0
    x[1, 256:512] *= 1e4  # a super-block far larger than the rest
    qmax = 32767 if dtype == np.int16 else 127
    x[2, :256] = np.float32(qmax / 2) * np.sign(x[2, :256])  # ties at .5 after scaling
    x[3, 5] = np.float32(1e-42)  # a subnormal alone in a block of zeros
    x[3, :5] = x[3, 6:256] = 0.0
    a = act_quant_k.quantize_k(x, act_quant_k.ActK(5, 768, dtype))
    q, d, s = quantize_activations_k(x, dtype)
    assert a.T == 4
    np.testing.assert_array_equal(act_quant_k.values(a.xq[:4]), q)
    np.testing.assert_array_equal(a.xd[:4], d)
    np.testing.assert_array_equal(a.xb[:4], s)
    assert (a.xd[0, 0] == 0) and not a.xq[0, :256].any()
    # and the parallel kernel's rows are the serial one's
    big = np.repeat(x, 5, axis=0)
    p = act_quant_k.quantize_k(big, act_quant_k.ActK(20, 768, dtype), threads=2)
    np.testing.assert_array_equal(act_quant_k.values(p.xq), np.repeat(q, 5, axis=0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("kind", SB)
def test_rows_match_the_quantized_product(kind, adversarial, dtype):
    N, K = 37, 768  # three super-blocks; a parallel chunk of 16 rows and a part one
    rng = np.random.default_rng(5)
    raw = raw_blocks(kind, N * K // 256, rng, adversarial).reshape(N, -1)
    raw.flags.writeable = False
    wd = quant.dequantize(raw, kind, (N, K)).astype(np.float64)
    x = rng.standard_normal((1, K)).astype(np.float32)
    x[0, :64] *= 1e4  # two blocks far larger than the rest of their super-block
    a = act_quant_k.quantize_k(x, act_quant_k.ActK(1, K, dtype))
    xv = act_quant_k.values(a.xq).astype(np.float64)
    xr = (xv.reshape(1, K // 256, 256) * a.xd[..., None]).reshape(1, K)
    ref, scale = xr @ wd.T, np.abs(xr) @ np.abs(wd).T
    code = quant.TYPES[kind].code
    rows = np.full((1, N), np.nan, np.float32)
    kquant_kact.mv_rows_kk(code, raw, a.xq, a.xd, a.xb, rows, 0, N)
    par = np.full((1, N), np.nan, np.float32)
    kquant_kact.mv_kk(code, raw, a.xq, a.xd, a.xb, par)
    assert np.isfinite(rows).all()
    assert (np.abs(rows - ref) <= 2e-6 * scale + 1e-30).all()
    np.testing.assert_array_equal(rows, par)
    part = np.full((1, N), np.nan, np.float32)
    kquant_kact.mv_rows_kk(code, raw, a.xq, a.xd, a.xb, part, 5, N)
    assert np.isnan(part[0, :5]).all()
    np.testing.assert_array_equal(part[0, 5:], rows[0, 5:])


@pytest.mark.parametrize("kind", SB)
def test_int16_superblocks_keep_float_precision(kind):
    """Against float activations: int16 per 256 values stays ~1e-5 of the row's magnitude
    (int8 per 256: ~1e-2)."""
    N, K = 24, 2048
    rng = np.random.default_rng(7)
    w = rng.standard_normal((N, K)).astype(np.float32)
    raw = quant.quantize(w, kind)
    raw.flags.writeable = False
    wd = quant.dequantize(raw, kind, (N, K)).astype(np.float64)
    x = rng.standard_normal((1, K)).astype(np.float32)
    exact = x.astype(np.float64) @ wd.T
    scale = (np.abs(x).astype(np.float64) @ np.abs(wd).T).max()
    err = {}
    for dtype in DTYPES:
        a = act_quant_k.quantize_k(x, act_quant_k.ActK(1, K, dtype))
        out = np.zeros((1, N), np.float32)
        kquant_kact.mv_rows_kk(quant.TYPES[kind].code, raw, a.xq, a.xd, a.xb, out, 0, N)
        err[np.dtype(dtype).name] = np.abs(out - exact).max() / scale
    assert err["int16"] < 1e-4
    assert err["int8"] < 3e-2


@pytest.mark.parametrize("kind", SB)
def test_int16_rows_are_exact_over_the_whole_int16_range(kind):
    """Rows on int16 integers at both ends of the range (-32768, 32767: the split into low
    and high bytes, act_quant_k.SPLIT) against the exact integer product: each super-block's
    integer sum is exact, so only the float scaling rounds (one scale d dx a super-block)."""
    N, K = 24, 1024
    rng = np.random.default_rng(11)
    raw = raw_blocks(kind, N * K // 256, rng, True).reshape(N, -1)
    raw.flags.writeable = False
    wd = quant.dequantize(raw, kind, (N, K)).astype(np.float64)
    q = rng.integers(-32768, 32768, (4, K)).astype(np.int16)
    q[0, rng.integers(0, K, 200)] = -32768
    q[0, rng.integers(0, K, 200)] = 32767
    q[1] = -32768
    q[2] = 32767
    q[3] = np.where(rng.random(K) < 0.5, -32768, 32767)
    xq = act_quant_k.pack(q)
    np.testing.assert_array_equal(act_quant_k.values(xq), q)
    xd = np.full((4, K // 256), 1e-3, np.float32)
    xb = q.astype(np.int32).reshape(4, -1, 16).sum(-1, dtype=np.int32)
    code = quant.TYPES[kind].code
    for t in range(4):
        out = np.full((1, N), np.nan, np.float32)
        kquant_kact.mv_rows_kk(code, raw, xq[t:t + 1], xd[t:t + 1], xb[t:t + 1], out, 0, N)
        xr = q[t].astype(np.float64) * 1e-3
        ref, scale = wd @ xr, np.abs(wd) @ np.abs(xr)
        assert (np.abs(out[0] - ref) <= 2e-6 * scale + 1e-30).all(), (t, out[0] - ref)


# sha256 (first 16 hex digits) of _decode_bits(kind) as the decode tiles computed it before
# decode's q4_k / q5_k vpdpwssd pairs, gf2p8affineqb codes and L1 prefetch, on the AVX-512
# VNNI path (the floats depend on a path's lanes, not on the CPU). Not recorded for the
# portable paths, which those changes did not touch: there a q5_k row's last bits differed
# between a process that compiled the kernel and one that loaded it from the cache
BEFORE = {
    ("vnni", "q4_k"): "380718a6e972e92c", ("vnni", "q5_k"): "35b1491cd2aba01a",
    ("vnni", "q6_k"): "134e5d836749352e",
}


def _simd_key() -> str:
    from edgellm.runtime import numba_setup, simd
    return "avx2" if numba_setup.ISA == "avx2" else simd.SIMD_PATH


def _decode_bits(kind) -> str:
    """The decode rows of adversarial blocks (codes and 6-bit scales at their highest) on
    int16 and int8 tokens at both ends of their ranges: sha256 of the float32 bits."""
    N, K = 21, 1024
    rng = np.random.default_rng(13)
    raw = raw_blocks(kind, N * K // 256, rng, True).reshape(N, -1)
    raw.flags.writeable = False
    code = quant.TYPES[kind].code
    h = hashlib.sha256()
    for dtype, lo, hi in ((np.int16, -32768, 32767), (np.int8, -128, 127)):
        q = rng.integers(lo, hi + 1, (4, K)).astype(dtype)
        q[1], q[2] = lo, hi
        q[3] = np.where(rng.random(K) < 0.5, lo, hi)
        xq = act_quant_k.pack(q)
        xd = rng.uniform(1e-4, 1e-2, (4, K // 256)).astype(np.float32)
        xb = q.astype(np.int32).reshape(4, -1, 16).sum(-1, dtype=np.int32)
        for t in range(4):
            one = np.full((1, N), np.nan, np.float32)
            kquant_kact.mv_rows_kk(code, raw, xq[t:t + 1], xd[t:t + 1], xb[t:t + 1], one, 0, N)
            assert np.isfinite(one).all()
            h.update(one.tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("kind", SB)
def test_decode_rows_are_the_tiles_of_before_bit_for_bit(kind):
    """Decode's tiles changed how each lane's integer is made (q4_k / q5_k on int16: the
    two byte-half dots as an i16 pair times (sc, 256 sc) in one vpdpwssd; q4_k's codes by
    gf2p8affineqb where the CPU has GFNI), not the integer nor the float work on it: the
    rows are the ones the tiles computed before, bit for bit, on every SIMD path."""
    key = (_simd_key(), kind)
    if key not in BEFORE:
        pytest.skip(f"no recorded rows for the {key[0]} path")
    assert _decode_bits(kind) == BEFORE[key]


def test_actk_and_quantize_k_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="multiple of 256"):
        act_quant_k.ActK(1, 320)
    with pytest.raises(ValueError, match="int8 or int16"):
        act_quant_k.ActK(1, 256, np.int32)
    a = act_quant_k.ActK(2, 512)
    with pytest.raises(ValueError, match="does not fit"):
        act_quant_k.quantize_k(np.zeros((3, 512), np.float32), a)
    with pytest.raises(ValueError, match="does not fit"):
        act_quant_k.quantize_k(np.zeros((1, 256), np.float32), a)
    with pytest.raises(ValueError, match="float32"):
        act_quant_k.quantize_k(np.zeros((1, 512), np.float64), a)
    with pytest.raises(ValueError, match="ActK"):
        act_quant_k.quantize_k(np.zeros((1, 512), np.float32), object())
