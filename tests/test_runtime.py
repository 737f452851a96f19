"""The runtime against transformers' reference outputs on the tiny llama-family fixtures."""

import numpy as np
import pytest
from conftest import LLAMA_FAMILY, reference
from reference_checks import (
    check_f32_matches_transformers,
    check_precise_is_exact,
    decode_steps,
    top1_agreement,
)

import edgellm
from edgellm.modelfile import quant


@pytest.mark.parametrize("name", LLAMA_FAMILY)
def test_f32_matches_transformers(name, converted):
    check_f32_matches_transformers(converted(name, "f32"), name)


@pytest.mark.parametrize("name", LLAMA_FAMILY)
@pytest.mark.parametrize("kind", quant.SIZED_TYPES)
def test_precise_path_is_exact_on_quantized_weights(name, kind, converted, tmp_path):
    check_precise_is_exact(converted(name, kind), name, tmp_path)


@pytest.mark.parametrize("name", LLAMA_FAMILY)
def test_default_path_top1_agreement(name, converted, record_property):
    agree = top1_agreement(converted, name)
    record_property("top1", agree)
    assert agree["q8_0"] >= 0.9


def test_sliding_window_ring_holds_only_the_window(converted):
    ref = reference("mistral-swa")
    with edgellm.load(converted("mistral-swa", "f32"), kv_type="f32") as llm:
        assert all(layer.cap == 16 for layer in llm.model.cache.layers)
        assert np.abs(decode_steps(llm, ref["input_ids"]) - ref["logits"]).max() < 1e-3


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_prefill_chunking_agrees(chunk, converted):
    ref = reference("qwen2")
    with edgellm.llm.LLM(converted("qwen2", "q8_0"), chunk=chunk, precise=True,
                         kv_type="f32") as llm:
        a = llm.logits(ref["input_ids"])
    with edgellm.load(converted("qwen2", "q8_0"), precise=True, kv_type="f32") as llm:
        b = llm.logits(ref["input_ids"])
    assert np.abs(a - b).max() < 1e-4


def test_context_shift_keeps_decoding(converted):
    """With a 16-token context, 40 tokens decode through shifts; sinks and positions hold."""
    with edgellm.load(converted("llama", "f32"), context=16) as llm:
        ids = reference("llama")["input_ids"]
        m = llm.model
        m.reset()
        for t in ids:
            logits = m.forward([t], want="last")
            assert np.isfinite(logits).all()
        assert m.cache.n_tokens <= 16 and m.cache.next_pos < len(ids)
        pos = m.cache.layers[0].pos
        kept = np.sort(pos[pos >= 0])
        assert list(kept[:4]) == [0, 1, 2, 3]  # attention sinks
        assert list(kept) == list(range(len(kept)))  # contiguous positions after the shift
        with pytest.raises(edgellm.EdgeLLMError, match="context"):
            m.forward(ids, want="last", shift=False)


def test_context_shift_re_ropes_keys_to_their_new_positions(converted):
    """After a shift, layer 0's cached keys equal those of a fresh run over the kept tokens
    (layer 0's keys depend only on token and position; deeper layers saw the dropped ones)."""
    ids = reference("llama")["input_ids"][:16]
    with edgellm.load(converted("llama", "f32"), context=16, kv_type="f32") as llm:
        m = llm.model
        m.reset()
        m.forward(ids, want="none")
        assert m.cache.shift(1) == 6  # drops positions 4..9: half of the 12 after 4 sinks
        layer = m.cache.layers[0]
        n = m.cache.n_tokens
        shifted_k, shifted_pos = layer.k[:n].copy(), layer.pos[:n].copy()
        kept = np.concatenate([ids[:4], ids[10:]])
        llm.logits(kept)
        assert list(shifted_pos) == list(range(n)) == list(layer.pos[:n])
        np.testing.assert_allclose(shifted_k, layer.k[:n], atol=1e-5)


def test_load_maps_the_file(converted):
    with edgellm.load(converted("llama", "q4_0")) as llm:
        t = llm.model.layers[0].q
        assert isinstance(t.data.base, np.memmap) or isinstance(t.data, np.memmap)
        assert not t.data.flags.writeable


def test_token_out_of_vocabulary(converted):
    with edgellm.load(converted("llama", "q8_0")) as llm:
        with pytest.raises(edgellm.EdgeLLMError, match="outside the vocabulary"):
            llm.logits([1, 2, 100000])
