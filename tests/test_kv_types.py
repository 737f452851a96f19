"""KV cache types f16 and q8_0 (kv_types.py, kv_cache.py, kernels/attention.attention_rows,
kernels/kv_store.kv_rows in the fused decode step)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_inputs, reference

import edgellm
from edgellm import memory_plan
from edgellm.cache.kv_cache import decode_rows, encode_rows
from edgellm.errors import CacheTypeError
from edgellm.kernels.attention import attention, attention_rows
from edgellm.modelfile import quant
from edgellm.modelfile.format import PackedModel
from edgellm.validate import check_model


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("T,cap,window,softcap", [(1, 37, 0, 0.0), (5, 0, 0, 0.0),
                                                   (20, 50, 16, 0.0), (33, 9, 0, 30.0)])
def test_attention_rows_is_attention_over_the_dequantized_cache(kv_type, T, cap, window,
                                                                softcap):
    Hq, Hkv, Dh = 6, 2, 64
    q, k_new, v_new, q_pos, k_cache, v_cache, pos = attention_inputs(T + cap, T, cap, Hq, Hkv,
                                                                     Dh)
    ks, vs = encode_rows(k_cache, kv_type), encode_rows(v_cache, kv_type)
    want = np.zeros((T, Hq, Dh), np.float32)
    attention(q, k_new, v_new, q_pos, decode_rows(ks, kv_type, Dh),
              decode_rows(vs, kv_type, Dh), pos, window, 0.125, softcap, want)
    got = np.zeros((T, Hq, Dh), np.float32)
    attention_rows(q, k_new, v_new, q_pos, ks.reshape(cap * Hkv, ks.shape[-1]),
                   vs.reshape(cap * Hkv, vs.shape[-1]), pos, window, 0.125, softcap, got)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_stored_rows_are_ggmls_bytes():
    x = np.random.default_rng(1).standard_normal((7, 2, 64), dtype=np.float32)
    q8 = encode_rows(x, "q8_0")
    assert q8.shape == (7, 2, 68) and q8.dtype == np.uint8
    assert np.array_equal(q8.reshape(14, 68), quant.quantize(x.reshape(14, 64), "q8_0", 32))
    f16 = encode_rows(x, "f16")
    assert np.array_equal(f16.view(np.float16), x.astype(np.float16))
    np.testing.assert_allclose(decode_rows(q8, "q8_0", 64), x, atol=0.02)


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "llama"])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_models_match_transformers_with_a_smaller_cache(converted, name, kv_type):
    ref = reference(name)
    head_dim = check_model(PackedModel(converted(name))).head_dim
    if kv_type == "q8_0" and head_dim % 32:
        with pytest.raises(CacheTypeError, match="multiple of 32"):
            edgellm.load(converted(name), kv_type=kv_type)
        return
    with edgellm.load(converted(name), context=64, kv_type=kv_type) as llm:
        assert llm.model.fused is None  # f32 weights: per-op (the fused step: test_fused_kv_types)
        ids = [int(i) for i in ref["input_ids"]]
        logits = llm.logits(ids)
        np.testing.assert_allclose(logits, ref["logits"], atol=5e-3 if kv_type == "f16" else 6e-2)
        llm.model.reset()
        out = [c.token for c in llm.stream_ids(ids, max_tokens=len(ref["greedy_ids"]),
                                               temperature=0) if c.token is not None]
        agree = np.mean(np.array(out) == ref["greedy_ids"][:len(out)])
        assert agree == 1.0 if kv_type == "f16" else agree >= 0.5


def test_context_shift_re_ropes_stored_keys(converted):
    ids = [int(i) for i in reference("llama")["input_ids"]]
    keys = {}
    for kv_type in ("f32", "f16"):
        with edgellm.load(converted("llama"), context=32, kv_type=kv_type) as llm:
            m = llm.model
            m.forward(ids[:30], want="none")
            m.forward(ids[30:34], want="last")  # does not fit: shifts
            layer = m.cache.layers[0]
            n = min(layer.written, layer.cap)
            keys[kv_type] = decode_rows(layer.k[:n], kv_type, layer.head_dim)
    np.testing.assert_allclose(keys["f16"], keys["f32"], atol=2e-2)


@pytest.mark.parametrize("name,context", [("qwen3", 128), ("gemma3", 100)])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_memory_plan_counts_the_stored_bytes(converted, name, context, kv_type):
    path = converted(name)
    with PackedModel(path) as packed:
        args = check_model(packed)
        p = memory_plan.plan(packed, args, context, kv_type)
        f32 = memory_plan.plan(packed, args, context, "f32")
    with edgellm.load(path, context=context, kv_type=kv_type) as llm:
        assert p.kv_cache == llm.model.cache.nbytes
    ratio = f32.kv_cache / p.kv_cache
    assert (1.9 < ratio < 2.0) if kv_type == "f16" else (3.4 < ratio < 3.8)


def test_unknown_kv_type_is_a_typed_error(converted):
    with pytest.raises(CacheTypeError, match="kv_type must be one of"):
        edgellm.load(converted("llama"), kv_type="q4_0")


def test_encoders_are_numpys_float16_and_quants_q8_0_bit_for_bit():
    from edgellm.kernels.kv_store import encode_f16

    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, size=(300, 512), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519, 65520, 65536, 6.1e-5,
                     5.96e-8, 2.98e-8, 1e-30], np.float32)
    x = np.concatenate([x.reshape(-1), edge])
    x = x[~np.isnan(x)]
    got = np.empty(x.size, np.uint16)
    encode_f16(x.view(np.uint32)[None], got[None])
    with np.errstate(over="ignore"):
        assert np.array_equal(got, x.astype(np.float16).view(np.uint16))
    y = rng.standard_normal((50, 3, 64)).astype(np.float32) * 10.0 ** rng.integers(-6, 4)
    y[1] = 0.0  # a block of zeros: scale 0
    want = quant.quantize(y.reshape(150, 64), "q8_0", 32)
    assert np.array_equal(encode_rows(y, "q8_0").reshape(150, 68), want)


def test_the_default_cache_is_f16_in_the_api_the_cli_and_the_server(converted):
    """f16 by default (half f32's bytes, the float model's greedy answers kept: docs/
    measurements.md); f32 still there when asked for."""
    import argparse

    path = converted("llama", "q8_0")
    with edgellm.load(path, context=64) as llm:
        assert llm.model.cache.kv_type == "f16"
        assert llm.model.cache.layers[0].k.dtype == np.uint16
    with edgellm.load(path, context=64, kv_type="f32") as llm:
        assert llm.model.cache.layers[0].k.dtype == np.float32
    from edgellm.commands.common import add_model_arguments, kv_type_of
    from edgellm.server.models import Served

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    assert kv_type_of(p.parse_args([])) == "f16"
    assert kv_type_of(p.parse_args(["--kv-type", "f32"])) == "f32"
    assert kv_type_of(argparse.Namespace()) == "f16"  # a command without the option
    assert Served(None).kv_type == "f16"
    with PackedModel(path) as packed:
        assert memory_plan.plan(packed, check_model(packed), 64).kv_type == "f16"


def test_prefill_chunks_read_an_f16_cache_as_float32_rows(converted, monkeypatch):
    """A prefill chunk after the first attends over its layer's f16 rows decoded into
    float32 by the tiled kernel (attention_rows, a row at a time, was 3-4x slower): the
    same logits as attention_rows' up to float rounding."""
    from edgellm.cache import kv_cache
    from edgellm.llm import LLM

    ids = reference("llama")["input_ids"]
    with LLM(converted("llama"), chunk=4, kv_type="f16") as llm:
        assert len(ids) > 8
        real = kv_cache.attention_rows

        def refused(*args):
            raise AssertionError("a prefill chunk read the f16 rows one at a time")
        monkeypatch.setattr(kv_cache, "attention_rows", refused)
        got = llm.logits(ids)
        monkeypatch.setattr(kv_cache, "attention_rows", real)
        for layer in llm.model.cache.layers:
            layer.f32_rows = None
        want = llm.logits(ids)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_prefill_decodes_f16_rows_exactly_with_the_conversion_kernel(monkeypatch):
    """F32Rows decodes a layer's f16 rows with decode_f16 (the CPU's conversion, where
    numpy's cast took most of a short chunk's attention over a cached prefix): every
    float16 value, subnormals and infinities included, to numpy's float32 bit for bit."""
    from edgellm.cache import kv_cache

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[~np.isnan(bits.view(np.float16))].copy()
    n = bits.size // 64
    rows = bits[:n * 64].reshape(n, 2, 32)  # [slots, n_kv, head_dim]
    calls = []
    real = kv_cache.decode_f16
    monkeypatch.setattr(kv_cache, "decode_f16",
                        lambda b, out: (calls.append(b.shape), real(b, out)))
    f32 = kv_cache.F32Rows(rows.shape[0] + 5, 2, 32)
    k, v = f32.decode(rows, rows[::-1].copy())
    assert calls == [(2 * n, 32), (2 * n, 32)]
    want = rows.view(np.float16).astype(np.float32)
    assert np.array_equal(k.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(v.view(np.uint32), want[::-1].view(np.uint32))
