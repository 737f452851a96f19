"""The fused decode step (one compiled call per token) computes what the per-operation
path computes."""

import numpy as np
import pytest
from conftest import LLAMA_FAMILY, reference

import edgellm
from edgellm import numba_setup


def decode_all(llm, ids, fused):
    m = llm.model
    keep, m.fused = m.fused, (m.fused if fused else None)
    try:
        m.reset()
        return np.stack([m.forward([t], want="last").copy() for t in ids])
    finally:
        m.fused = keep


@pytest.mark.parametrize("name", LLAMA_FAMILY)
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_equals_per_operation_path(name, kind, threads, converted):
    ids = reference(name)["input_ids"]
    with edgellm.load(converted(name, kind), precise=True, threads=threads) as llm:
        assert llm.model.fused is not None
        a, b = decode_all(llm, ids, True), decode_all(llm, ids, False)
        assert np.abs(a - b).max() < 1e-4
    with edgellm.load(converted(name, kind), threads=threads) as llm:
        a, b = decode_all(llm, ids, True), decode_all(llm, ids, False)
        # int8 activations: the two paths round the same values, so they agree closely
        assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9


def test_fused_follows_the_reference_at_q8_0(converted):
    ref = reference("qwen2")
    with edgellm.load(converted("qwen2", "q8_0"), precise=True) as llm:
        m = llm.model
        m.reset()
        last, out = m.forward(ref["input_ids"], want="last"), []
        for _ in range(8):
            out.append(int(last.argmax()))
            last = m.forward([out[-1]], want="last")
    assert out == list(ref["greedy_ids"][:8])


def test_fused_through_context_shifts(converted):
    ids = reference("llama")["input_ids"]
    with edgellm.load(converted("llama", "q8_0"), context=16, precise=True) as llm:
        a = decode_all(llm, ids, True)
        b = decode_all(llm, ids, False)
    assert np.abs(a - b).max() < 1e-4


def test_float_weights_use_the_per_operation_path(converted):
    with edgellm.load(converted("llama", "f32")) as llm:
        assert llm.model.fused is None


def test_threading_layer_is_not_workqueue(converted):
    with edgellm.load(converted("llama", "q8_0"), threads=2) as llm:
        llm.logits([1, 2, 3])
        assert numba_setup.check_threading_layer() in ("omp", "tbb")
