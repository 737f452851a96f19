"""The fused decode step reads and writes f16 and q8_0 KV caches itself (kernels/kv_store.py:
kv_rows, store_kv_row): every architecture it serves decodes through it with those caches,
and each of its steps is the per-operation path's step from the same cache."""

import numpy as np
import pytest
from conftest import LLAMA_FAMILY, reference

import edgellm
from edgellm.cache.kv_cache import decode_rows, encode_rows
from edgellm.kernels.jit import kernel
from edgellm.kernels.kv_store import kv_rows

# every architecture the fused step serves; q8_0 needs head_dim % 32 == 0 (gemma3, qwen3)
SERVED = LLAMA_FAMILY + ["gemma3", "phi3", "olmo2", "granite", "qwen3-moe", "mixtral"]
Q8_0 = ["gemma3", "qwen3"]


def _step_pairs(llm, ids):
    """For each token of ids: (fused step's logits, per-op step's logits, the cache after
    each), both steps run from the same cache (the fused one's, restored), so that neither
    inherits the other's rounding of earlier keys."""
    m = llm.model
    m.reset()
    fused = m.fused
    for t in ids:
        before, tokens = m.cache.state(), list(m.tokens)
        a = m.forward([t], want="last").copy()
        after_a = m.cache.state()
        m.cache.restore(before)
        m.tokens[:] = tokens
        m.fused = None
        try:
            b = m.forward([t], want="last").copy()
        finally:
            m.fused = fused
        after_b = m.cache.state()
        m.cache.restore(after_a)
        m.tokens[:] = tokens + [t]
        yield a, b, after_a, after_b


def _check_written_rows(kv_type, head_dim, fa, fb):
    """The rows the two steps stored: the same bytes, but where the steps' float keys differ
    in their last bits a rounding boundary may fall between them: then one f16 ulp, or one
    q8_0 step of the block (d = amax / 127), apart."""
    for ka, kb, va, vb in zip(fa.k, fb.k, fa.v, fb.v):
        for x, y in ((ka, kb), (va, vb)):
            assert x.shape == y.shape
            differ = (x != y).mean()
            assert differ < 0.02, differ
            dx, dy = decode_rows(x, kv_type, head_dim), decode_rows(y, kv_type, head_dim)
            amax = np.abs(dy).reshape(*dy.shape[:-1], -1, 32 if kv_type == "q8_0" else
                                      head_dim).max(-1, keepdims=True)
            step = (amax / 127 * 1.01 if kv_type == "q8_0" else amax / 1024).repeat(
                32 if kv_type == "q8_0" else head_dim, -1).reshape(dy.shape)
            assert (np.abs(dx - dy) <= step + 1e-7).all()


@pytest.mark.parametrize("name", SERVED)
def test_f16_cache_decodes_through_the_fused_step_as_the_per_operation_path(name, converted):
    _check_steps(converted(name, "q8_0"), name, "f16")


@pytest.mark.parametrize("name", Q8_0)
def test_q8_0_cache_decodes_through_the_fused_step_as_the_per_operation_path(name, converted):
    _check_steps(converted(name, "q8_0"), name, "q8_0")


def _check_steps(path, name, kv_type):
    """40 tokens, context 24: Gemma 3's and mistral-swa's sliding windows (16) wrap their
    rings, and the full-attention layers shift once; 2 threads. With float activations
    (precise) the steps agree to float noise and store the same rows; with int16
    activations the paths round their activations apart (as with an f32 cache), so their
    logits agree closely and their top-1 tokens all but always."""
    ids = [int(i) for i in reference(name)["input_ids"]]
    for precise in (True, False):
        with edgellm.load(path, precise=precise, threads=2, context=24, kv_type=kv_type) as llm:
            assert llm.model.fused is not None  # decodes through the fused step
            Dh = llm.model.args.head_dim
            top = []
            for a, b, fa, fb in _step_pairs(llm, ids):
                if precise:
                    assert np.abs(a - b).max() < 1e-4
                    _check_written_rows(kv_type, Dh, fa, fb)
                else:
                    print(np.abs(a - b).max())
                    assert np.abs(a - b).max() < 1e-2
                    top.append(a.argmax() == b.argmax())
            assert np.mean(top) >= 0.9 if top else precise


@kernel
def _read(rows, s, m, tile, out):
    src, r = kv_rows(rows, s, m, tile)
    for j in range(m):
        for i in range(out.shape[1]):
            out[j, i] = src[r + j, i]


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_kv_rows_decode_a_strided_head_as_the_reference(kv_type):
    """kv_rows on one KV head's rows of a [slots, Hkv, width] cache (rows strided) decodes
    rows s..s+m-1 as decode_rows does, reading nothing around them."""
    x = np.random.default_rng(4).standard_normal((40, 3, 64), dtype=np.float32)
    stored = encode_rows(x, kv_type)
    tile = np.zeros((16, 64), np.float32)
    for s, m in ((0, 16), (24, 16), (37, 3), (39, 1)):
        out = np.zeros((m, 64), np.float32)
        _read(stored[:, 1], s, m, tile, out)
        np.testing.assert_array_equal(out, decode_rows(stored[s:s + m, 1], kv_type, 64))
