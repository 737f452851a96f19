"""edgellm.kernels.linear against the numpy oracle in edgellm.modelfile.quant.

default (int8 activations): x is quantized with quant.quantize_activations_q8 and the
  reference is the float64 product of the dequantized activations and weights; the kernel's
  integer block dots are exact, so only float32 summation error remains.
precise: the reference is x @ dequantize(W).T in float64.
Errors are measured against sum_j |x_j| |W_ij|, the natural scale of a dot product's
rounding error.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgellm.kernels import linear as L
from edgellm.modelfile import quant
from edgellm.modelfile.format import Tensor
from edgellm.runtime import numba_setup

QTYPES = quant.SIZED_TYPES  # every block-size type; K-quants: test_kernels_kquant.py
FTYPES = quant.FLOAT_TYPES
RTOL = 2e-5  # of sum |x| |w|


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    n = min(request.param, numba.config.NUMBA_NUM_THREADS)
    previous = numba_setup.set_threads(n)
    yield n
    numba.set_num_threads(previous)


def make_weight(kind: str, N: int, K: int, block: int = 32, seed: int = 0) -> Tensor:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    w[:, :4] *= 8  # some outliers, so block scales differ
    data = quant.quantize(w, kind, block)
    data.flags.writeable = False  # as the memmapped file's views
    return Tensor("w", kind, (N, K), block, data)


def make_x(T: int, K: int, seed: int = 1) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((T, K)).astype(np.float32)
    x[:, 1] *= 20
    return x


def oracle(w: Tensor, x: np.ndarray, precise: bool) -> tuple[np.ndarray, np.ndarray]:
    """(reference product, error scale sum |x||w|), both float64 [T, N]."""
    wd = w.dequantize().astype(np.float64)
    if precise or w.type in FTYPES:
        xr = x.astype(np.float64)
    else:
        xq, xd, _ = quant.quantize_activations_q8(x)
        T, K = x.shape
        xr = (xq.astype(np.float64).reshape(T, K // 32, 32) * xd[..., None]).reshape(T, K)
    return xr @ wd.T, np.abs(xr) @ np.abs(wd).T


def check(out: np.ndarray, ref: np.ndarray, scale: np.ndarray, rtol: float = RTOL) -> None:
    err = np.abs(out.astype(np.float64) - ref)
    bad = err > rtol * scale + 1e-30
    assert not bad.any(), (f"{bad.sum()} of {bad.size} outputs off; worst relative error "
                           f"{(err / (scale + 1e-30)).max():.2e}")


def run(w: Tensor, x: np.ndarray, **kw) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    L.linear(w, x, out, **kw)
    return out


# --- every type x block size x mode, decode and prefill ---------------------------------

@pytest.mark.parametrize("precise", [False, True], ids=["int8", "precise"])
@pytest.mark.parametrize("block", quant.BLOCK_SIZES)
@pytest.mark.parametrize("kind", QTYPES)
@pytest.mark.parametrize("T", [1, 5])
def test_quantized_matches_oracle(kind, block, precise, T, threads):
    w = make_weight(kind, 37, 256, block)  # 37 rows: not a multiple of any chunk
    x = make_x(T, 256)
    check(run(w, x, precise=precise), *oracle(w, x, precise))


@pytest.mark.parametrize("K", [256, 100, 7])  # K % 16 != 0 takes the scalar tail
@pytest.mark.parametrize("kind", FTYPES)
@pytest.mark.parametrize("T", [1, 6])
def test_float_weights_match_oracle(kind, K, T, threads):
    w = make_weight(kind, 19, K)
    x = make_x(T, K)
    ref = oracle(w, x, True)
    check(run(w, x), *ref)
    check(run(w, x, precise=True), *ref)


@pytest.mark.parametrize("T", [1, 2, 3, 5, 11, 130])
@pytest.mark.parametrize("kind", QTYPES + FTYPES)
def test_token_counts(kind, T, threads):
    """Tails of the 6- and 4-token groups, and T == 1 vs T > 1 paths giving the same rows."""
    w = make_weight(kind, 45, 96)
    x = make_x(T, 96)
    for precise in (False, True):
        out = run(w, x, precise=precise)
        check(out, *oracle(w, x, precise))
        rows = np.concatenate([run(w, x[t:t + 1], precise=precise) for t in range(T)])
        np.testing.assert_allclose(out, rows, rtol=1e-5, atol=1e-5 * np.abs(rows).max())


@pytest.mark.parametrize("kind", QTYPES + FTYPES)
@pytest.mark.parametrize("N", [1, 2, 3, 17, 33])
def test_small_shapes(kind, N, threads):
    """One row, odd rows (row pairs, chunks of 16), the smallest K of one block."""
    w = make_weight(kind, N, 32)
    for T in (1, 3):
        x = make_x(T, 32)
        for precise in (False, True):
            check(run(w, x, precise=precise), *oracle(w, x, precise))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(QTYPES), block=st.sampled_from(quant.BLOCK_SIZES),
       N=st.integers(1, 70), nblocks=st.integers(1, 5), T=st.integers(1, 9),
       precise=st.booleans(), seed=st.integers(0, 2**16))
def test_random_shapes(kind, block, N, nblocks, T, precise, seed):
    w = make_weight(kind, N, nblocks * block, block, seed)
    x = make_x(T, nblocks * block, seed + 1)
    check(run(w, x, precise=precise), *oracle(w, x, precise))


def test_zero_and_constant_blocks():
    """All-zero activation blocks (scale 0) and all-equal weights (q4_1 scale 0)."""
    K = 128
    x = make_x(3, K)
    x[:, 32:64] = 0
    wf = np.random.default_rng(3).standard_normal((9, K)).astype(np.float32)
    wf[:, 64:96] = 0.25
    for kind in QTYPES:
        w = Tensor("w", kind, (9, K), 32, quant.quantize(wf, kind))
        for precise in (False, True):
            check(run(w, x, precise=precise), *oracle(w, x, precise))


def test_memmapped_weights(tmp_path):
    """Read-only np.memmap views, as format.PackedModel hands them out."""
    N, K = 21, 128
    data = make_weight("q4_1", N, K).data
    path = tmp_path / "w.bin"
    data.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r").reshape(N, -1)
    w = Tensor("w", "q4_1", (N, K), 32, mm)
    x = make_x(2, K)
    check(run(w, x), *oracle(w, x, False))
    check(run(w, x[:1]), *oracle(w, x[:1], False))
    fdata = make_weight("f16", N, K).data
    fdata.tofile(tmp_path / "f.bin")
    fm = np.memmap(tmp_path / "f.bin", dtype=np.float16, mode="r").reshape(N, K)
    wf = Tensor("w", "f16", (N, K), 32, fm)
    check(run(wf, x), *oracle(wf, x, True))


# --- activation quantization and reuse --------------------------------------------------

@pytest.mark.parametrize("T", [1, 3, 40])
def test_quantize_act_is_the_oracle(T, threads):
    x = make_x(T, 160)
    x[0, :32] = 0  # a zero block
    x[-1, 32:64] = np.float32(127 / 2) * np.sign(x[-1, 32:64])  # ties at .5 after scaling
    x[0, 64:96] = 0
    x[0, 70] = np.float32(1e-42)  # a subnormal alone: d subnormal, 1 / d overflows: codes 0
    act = L.quantize_act(x, L.ActQ8(50, 160))
    xq, xd, xs = quant.quantize_activations_q8(x)
    assert act.T == T
    np.testing.assert_array_equal(act.xq[:T], xq)
    np.testing.assert_array_equal(act.xd[:T], xd)
    np.testing.assert_array_equal(act.xs[:T], xs)
    np.testing.assert_allclose(act.xds[:T], xd * xs, rtol=1e-6)


def test_shared_activations_equal_fresh_ones():
    x = make_x(4, 192)
    act = L.quantize_act(x, L.ActQ8(8, 192))
    for kind in QTYPES:
        w = make_weight(kind, 24, 192)
        np.testing.assert_array_equal(run(w, x, act=act), run(w, x))
        act1 = L.quantize_act(x[2:3], L.ActQ8(1, 192))
        np.testing.assert_array_equal(run(w, x[2:3], act=act1), run(w, x[2:3]))


def test_precise_ignores_act_and_is_closer_to_float():
    x = make_x(1, 256)
    w = make_weight("q8_0", 64, 256)
    ref, scale = oracle(w, x, True)
    act = L.quantize_act(x, L.ActQ8(1, 256))
    precise = run(w, x, precise=True, act=act)
    check(precise, ref, scale)
    assert np.abs(precise - ref).max() < np.abs(run(w, x) - ref).max()


# --- embedding --------------------------------------------------------------------------

@pytest.mark.parametrize("block", quant.BLOCK_SIZES)
@pytest.mark.parametrize("kind", QTYPES + FTYPES)
def test_embedding_rows(kind, block):
    D = 128 if kind in QTYPES else 100  # f32/f16: D % 16 != 0 takes the scalar tail
    w = make_weight(kind, 50, D, block)
    ids = np.array([0, 49, 7, 7, 23])
    out = np.full((5, D), np.nan, np.float32)
    L.embedding(w, ids, out)
    np.testing.assert_array_equal(out, w.dequantize()[ids])
    one = np.empty((1, D), np.float32)
    L.embedding(w, np.array([13], np.int32), one)
    np.testing.assert_array_equal(one[0], w.dequantize()[13])


# --- validation -------------------------------------------------------------------------

def test_linear_rejects_bad_inputs():
    w = make_weight("q4_0", 8, 64)
    x = make_x(2, 64)
    out = np.empty((2, 8), np.float32)
    bad_calls = {
        "float64 x": lambda: L.linear(w, x.astype(np.float64), out),
        "1-D x": lambda: L.linear(w, x[0], out[0]),
        "strided x": lambda: L.linear(w, make_x(2, 128)[:, ::2], out),
        "wrong K": lambda: L.linear(w, make_x(2, 96), out),
        "wrong out rows": lambda: L.linear(w, x, np.empty((3, 8), np.float32)),
        "wrong out cols": lambda: L.linear(w, x, np.empty((2, 9), np.float32)),
        "float64 out": lambda: L.linear(w, x, np.empty((2, 8))),
        "Fortran out": lambda: L.linear(w, x, np.empty((8, 2), np.float32).T),
        "read-only out": lambda: L.linear(w, x, _readonly(out)),
        "not a tensor": lambda: L.linear(w.data, x, out),
        "unknown type": lambda: L.linear(Tensor("w", "bf16", (8, 64), 32, w.data), x, out),
        "bad block": lambda: L.linear(Tensor("w", "q4_0", (8, 64), 16, w.data), x, out),
        "short data": lambda: L.linear(Tensor("w", "q4_0", (8, 64), 32, w.data[:, :20]),
                                       x, out),
        "float data": lambda: L.linear(Tensor("w", "f32", (8, 64), 32,
                                              np.zeros((8, 64), np.float16)), x, out),
        "act K": lambda: L.linear(w, x, out, act=L.quantize_act(make_x(2, 96),
                                                                 L.ActQ8(2, 96))),
        "act T": lambda: L.linear(w, x, out, act=L.quantize_act(x[:1], L.ActQ8(2, 64))),
        "act type": lambda: L.linear(w, x, out, act=object()),
    }
    for what, call in bad_calls.items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(what)
    with pytest.raises(ValueError, match="overlaps"):
        buf = np.zeros((2, 64), np.float32)
        L.linear(make_weight("f32", 64, 64), buf, buf)


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def test_act_and_embedding_reject_bad_inputs():
    with pytest.raises(ValueError):
        L.ActQ8(4, 48)
    with pytest.raises(ValueError):
        L.ActQ8(0, 64)
    with pytest.raises(ValueError):
        L.quantize_act(make_x(5, 64), L.ActQ8(4, 64))
    with pytest.raises(ValueError):
        L.quantize_act(make_x(2, 96), L.ActQ8(4, 64))
    w = make_weight("q8_0", 10, 64)
    out = np.empty((2, 64), np.float32)
    for ids in ([0, 10], [-1, 3], [0.0, 1.0], [[1, 2]]):
        with pytest.raises(ValueError):
            L.embedding(w, np.array(ids), out if len(ids) == 2 else out[:1])
    with pytest.raises(ValueError):
        L.embedding(w, np.array([1, 2, 3]), out)


def test_empty_batch_is_a_no_op():
    w = make_weight("q4_1", 8, 64)
    L.linear(w, np.empty((0, 64), np.float32), np.empty((0, 8), np.float32))
    L.embedding(w, np.empty(0, np.int64), np.empty((0, 64), np.float32))


# --- numba_setup --------------------------------------------------------------------------

def test_numba_setup():
    assert numba.config.CACHE_DIR  # set by numba_setup unless the user set it
    previous = numba_setup.set_threads(1)
    try:
        assert numba.get_num_threads() == 1
        for bad in (0, numba.config.NUMBA_NUM_THREADS + 1, 1.5, True, "2"):
            with pytest.raises(ValueError):
                numba_setup.set_threads(bad)
    finally:
        numba.set_num_threads(previous)
    run(make_weight("q8_0", 40, 64), make_x(1, 64))  # make sure the pool has started
    assert numba_setup.check_threading_layer() in ("omp", "tbb", "workqueue")


def test_cache_dir_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path / "home"))
    assert numba_setup._default_cache_dir() == str(tmp_path / "home" / "numba-cache")
    monkeypatch.delenv("EDGELLM_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert numba_setup._default_cache_dir() == str(tmp_path / "xdg" / "edgellm" / "numba-cache")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # unusable: the next candidate wins
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert numba_setup._default_cache_dir() == str(tmp_path / "user" / ".cache" / "edgellm"
                                                   / "numba-cache")
    assert numba_setup._pick_threading_layer() in ("omp", "tbb", None)


def _packer(kind):
    """A jitted call of the type's "pack" tile (tiles.py; intrinsics are not first-class
    values)."""
    from edgellm.kernels.family import tile

    code = quant.TYPES[kind].code

    @numba.njit(cache=False)
    def run(w, block, i, pan, scales):
        tile(code, "pack", w, block, i, pan, scales, 0)
    return run


@pytest.mark.parametrize("block", quant.BLOCK_SIZES)
@pytest.mark.parametrize("kind", QTYPES)
def test_panel_layout(kind, block):
    """pack_<type> writes panel.py's layout: chunk c of a 32-column sub-block holds bytes
    4c..4c+3 of the 8 rows side by side, unsigned; then each row's scale (and minimum)."""
    from edgellm.kernels import matmul

    N, K, i = 11, 256, 2  # rows i..i+7 of 11
    w = make_weight(kind, N, K, block)
    hdr = 4 if kind == "q4_1" else 2
    blocks = w.data.reshape(N, K // block, -1)
    if kind == "q8_0":
        vals = blocks[:, :, hdr:].view(np.int8).astype(np.int64) + 128
    else:
        vals = quant._unpack_nibbles(blocks[:, :, hdr:]).astype(np.int64)
    vals = vals.reshape(N, K)[i:i + 8]  # [8 rows, K] in column order
    d = blocks[:, :, :2].copy().view("<f2")[i:i + 8, :, 0].astype(np.float32)

    pan, scales = matmul.panel_scratch(K)
    _packer(kind)(w.data, block, i, pan, scales)

    want = vals.reshape(8, K // 32, 8, 4).transpose(1, 2, 0, 3).reshape(-1)  # [sb, c, r, k]
    np.testing.assert_array_equal(pan[0, :want.size].astype(np.int64), want)  # (q6_k's wide
    # panels make the scratch twice as long)
    sc = scales[0].reshape(K // 32, 2, 8)
    np.testing.assert_array_equal(sc[:, 0], np.repeat(d.T, block // 32, axis=0))
    if kind == "q4_1":
        m = blocks[:, :, 2:4].copy().view("<f2")[i:i + 8, :, 0].astype(np.float32)
        np.testing.assert_array_equal(sc[:, 1], np.repeat(m.T, block // 32, axis=0))


# --- decode=True: a few sequences' steps at once, each row its T == 1 result --------------

@pytest.mark.parametrize("act_dtype", [np.int8, np.int16], ids=["int8", "int16"])
@pytest.mark.parametrize("N", [17, 64])  # 17: a last row past the row groups
@pytest.mark.parametrize("kind", sorted(L.registry.BATCH))
@pytest.mark.parametrize("T", [2, 5, 8])
def test_decode_rows_are_each_rows_matvec(kind, N, T, act_dtype, threads):
    """The beams' kernel (matvec's row groups over all rows, the weights read once) gives
    each row what the one-row kernel gives it alone, bit for bit (block size 32)."""
    w, x = make_weight(kind, N, 256), make_x(T, 256)
    alone = np.concatenate([run(w, x[t:t + 1].copy(), act_dtype=act_dtype) for t in range(T)])
    together = run(w, x, act_dtype=act_dtype, decode=True)
    assert np.array_equal(together, alone)


def test_decode_rows_cover_the_int8_families():
    assert {"q8_0", "q4_0", "q4_1"} <= set(L.registry.BATCH)
