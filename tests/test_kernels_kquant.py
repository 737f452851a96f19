"""K-quants (q2_k .. q6_k), q5_0, q5_1 and iq4_nl (one fixed block size each): the numpy
reference against the gguf package, and the kernels (kernels/kquant.py, or the generated
family, through linear()/embedding() and the fused decode step) against
the reference, on random and adversarial blocks (extreme and zero scales, all-zero
sub-blocks, codes at their limits)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from edgellm.kernels import linear as L
from edgellm.modelfile import quant, quant_k
from edgellm.modelfile.format import Tensor
from edgellm.runtime import numba_setup

gguf = pytest.importorskip("gguf")

KTYPES = quant.K_TYPES
RTOL = 2e-5  # of sum |x| |w|, as test_kernels_linear


def raw_blocks(kind: str, n: int, rng, adversarial: bool) -> np.ndarray:
    """n blocks of random bytes with finite f16 scales; adversarial: scales at f16's extremes
    (65504, subnormal, zero), a zero block, codes all at their highest."""
    t = quant.TYPES[kind]
    raw = rng.integers(0, 256, (n, t.block_bytes(256)), dtype=np.uint8)
    at = quant_k.F16_AT.get(kind, range(0, t.header_bytes, 2))  # (iq4_nl: its d at 0)
    scales = rng.uniform(-1, 1, (n, len(at))).astype(np.float32)
    if adversarial:
        scales[0::4] = np.float32(65504) / np.float32(1024)  # large: values up to ~4e4 x codes
        scales[1::4] = np.float32(6e-8)  # f16 subnormal
        scales[2::4] = 0.0
        raw[3::4, :] = 0xFF if kind != "q6_k" else raw[3::4, :]
    for j, off in enumerate(at):
        raw[:, off:off + 2] = scales[:, j].astype("<f2").view(np.uint8).reshape(n, 2)
    if adversarial:
        raw[-1] = 0  # an all-zero block
    return raw


@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("kind", KTYPES)
def test_dequantize_is_gguf_bit_for_bit(kind, adversarial):
    rng = np.random.default_rng(3)
    raw = raw_blocks(kind, 64, rng, adversarial)
    B = quant.TYPES[kind].blocks[0]
    ref = gguf.quants.dequantize(raw.reshape(8, -1), gguf.GGMLQuantizationType[kind.upper()])
    mine = quant.dequantize(raw.reshape(8, -1), kind, (8, 8 * B))
    np.testing.assert_array_equal(mine, ref)


def weights(kind: str, N: int, K: int, seed: int, adversarial: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    if adversarial:
        w[0] = 0.0  # an all-zero row
        w[1, :32] = 0.0  # an all-zero sub-block (q4_k, q5_k: 32 wide) among others
        w[2, ::7] *= 1e4  # outliers: extreme sub-block scales next to small ones
        w[3] *= 1e-6  # tiny scales (f16 subnormals)
        w[4, :128] = 3.0  # constant sub-blocks
    return w


@pytest.mark.parametrize("kind", KTYPES)
def test_quantize_round_trip_error(kind):
    """Reference quantization (llama.cpp's rules) keeps every block near its values, adversarial
    blocks included; an all-zero row stays exactly zero."""
    w = weights(kind, 6, 512, 0, True)
    y = quant.dequantize(quant.quantize(w, kind), kind, w.shape)
    assert np.isfinite(y).all()
    assert (y[0] == 0).all() and (y[1, :32] == 0).all()
    bits = quant.TYPES[kind].bits
    for r in (1, 4, 5):  # relative RMS error, per row
        err = np.sqrt(np.mean((y[r] - w[r]) ** 2) / np.mean(w[r] ** 2))
        assert err < {2: 0.5, 3: 0.3, 4: 0.15, 5: 0.08, 6: 0.04}[bits], (r, err)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    n = min(request.param, numba.config.NUMBA_NUM_THREADS)
    previous = numba_setup.set_threads(n)
    yield n
    numba.set_num_threads(previous)


@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("T", [1, 19])  # decode, prefill (a whole 16-row panel and a tail)
@pytest.mark.parametrize("kind", KTYPES)
def test_linear_matches_reference(kind, T, adversarial, threads):
    N, K = 37, 512  # 37 rows: a 16-row panel group, a tail, not a multiple of any chunk
    data = quant.quantize(weights(kind, N, K, 1, adversarial), kind)
    data.flags.writeable = False
    w = Tensor("w", kind, (N, K), quant.TYPES[kind].blocks[0], data)
    x = np.random.default_rng(2).standard_normal((T, K)).astype(np.float32)
    x[:, 1] *= 20
    wd = w.dequantize().astype(np.float64)
    ref, scale = x.astype(np.float64) @ wd.T, np.abs(x.astype(np.float64)) @ np.abs(wd).T
    out = np.full((T, N), np.nan, np.float32)
    L.linear(w, x, out, precise=True)
    assert (np.abs(out - ref) <= RTOL * scale + 1e-30).all()
    for dt in (np.int8, np.int16):  # kquant_int.py's kernels, or float activations (q2/q3_k)
        out = np.full((T, N), np.nan, np.float32)
        L.linear(w, x, out, act_dtype=dt)
        if quant.TYPES[kind].int8_kernels:  # against the product of the quantized x
            a = L.quantize_act(x, L.ActQ8(T, K, dt))
            xr = (a.xq.astype(np.float64).reshape(T, K // 32, 32) * a.xd[..., None]).reshape(T, K)
            want, s = xr @ wd.T, np.abs(xr) @ np.abs(wd).T
        else:
            want, s = ref, scale
        assert (np.abs(out - want) <= RTOL * s + 1e-30).all(), dt
    ids = np.array([0, 2, 36, 3])
    emb = np.zeros((4, K), np.float32)
    L.embedding(w, ids, emb)
    np.testing.assert_array_equal(emb, wd[ids].astype(np.float32))


def test_wrong_block_size_is_refused():
    data = quant.quantize(np.ones((2, 256), np.float32), "q4_k")
    with pytest.raises(ValueError, match="block size 32 is not one of"):
        L.linear(Tensor("w", "q4_k", (2, 256), 32, data), np.ones((1, 256), np.float32),
                 np.zeros((1, 2), np.float32))


def test_gguf_q5_0_and_q5_1_are_kept_and_decode_fused(tmp_path):
    """convert-model's `keep` copies q5_0 / q5_1 GGUF tensors byte for byte, and the model runs
    them in the fused decode step as the per-operation path does."""
    from reference_checks import check_fused_equals_per_operation
    from test_arch_gemma3 import NAME, write_gemma3_gguf

    from converter.gguf_source import open_gguf
    from converter.pack import convert
    from edgellm.modelfile.format import PackedModel

    for qt in (gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q5_1):
        path = tmp_path / f"{qt.name}.gguf"
        write_gemma3_gguf(path, qt)
        src = open_gguf(path)
        out = tmp_path / f"{qt.name}.edgellm"
        convert(src, out, "keep", progress=False)
        raw = {t.name: t for t in src.tensors()}
        with PackedModel(out) as p:
            kept = [n for n, t in p.tensors.items() if t.type == qt.name.lower()]
            assert kept
            for n in kept:  # x16 stores the same bytes interleaved
                np.testing.assert_array_equal(p.tensor(n).rows(), raw[n].load_raw())
        check_fused_equals_per_operation(out, NAME)


def test_gguf_default_recipe_keeps_k_quants_and_auto_makes_them_q8_0():
    """convert-model's GGUF default (`keep`) keeps every type, K-quants included (their
    integer-activation kernels decode as fast as q8_0's); `auto` keeps the sized-block
    types and turns K-quants, q5_0 and q5_1 into q8_0."""
    from converter.recipes import DEFAULT_GGUF, choose_type

    assert DEFAULT_GGUF == "keep"
    name = "model.layers.0.mlp.up_proj.weight"
    for src in ("q8_0", "q4_0", "q4_1", "f16", "f32"):
        assert choose_type(name, (256, 256), src, "auto", 32) == src
    for src in ("q4_k", "q5_k", "q6_k", "q2_k", "q3_k", "q5_0", "q5_1", "bf16"):
        assert choose_type(name, (256, 256), src, "auto", 32) == "q8_0"
    for src in ("q4_k", "q6_k", "q5_0"):
        assert choose_type(name, (256, 256), src, "keep", 32) == src


def test_k_mixes_choose_llama_quantize_types():
    """--quant q4_k_m / q5_k_m / q6_k give every SmolLM2-135M matrix the type llama-quantize
    gave it (its Q4_K_M, Q5_K_M, Q6_K files made from a float GGUF; 576 columns fall back)."""
    import json

    from conftest import FIXTURES

    from converter.recipes import choose_type

    ref = json.loads((FIXTURES / "kquant" / "smollm2_llama_quantize_types.json").read_text())
    cfg = ref.pop("config")
    for recipe, tensors in ref.items():
        for name, (shape, want) in tensors.items():
            got = choose_type(name, tuple(shape), "f32", recipe, 32, cfg["num_hidden_layers"],
                              cfg["tie_word_embeddings"])
            assert got == want, (recipe, name, got, want)
