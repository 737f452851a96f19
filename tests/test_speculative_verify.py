"""Speculative verification (step/batched.py with a slot repeated, batch_step._attend_chain):
k rows at the next k positions of ONE sequence's cache in one batched step give, at every
position, the single fused decode step's logits bit for bit; the cache takes rejected
positions back (KVCache.take_back) and goes on as if they had never run."""

import numpy as np
import pytest
from conftest import reference
from speculative_models import gemma3, smollm2

from edgellm import loader
from edgellm.modelfile.format import PackedModel
from edgellm.speculative.verify import EXACT_INTERLEAVED
from edgellm.step.batched import BatchDecoder

SPARE = 7  # rows of a verify step: up to 8


def _model(path, kv_type="f32", spare=SPARE, threads=None):
    packed = PackedModel(path)
    m = loader.build(packed, kv_type=kv_type, kv_spare=spare)
    assert m.fused is not None
    return m


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _sequential(m, prompt, tokens):
    """The single fused step's logits [len(tokens), V] after `prompt`, token by token."""
    m.reset()
    m.forward(prompt, want="none")
    return np.stack([m.forward([t], want="last").copy() for t in tokens])


def _verified(m, prompt, tokens, k, stepper=None):
    """The same logits, k rows of the sequence a step (the verify step)."""
    m.reset()
    m.forward(prompt, want="none")
    stepper = stepper or BatchDecoder(m, [m.cache], interleave=EXACT_INTERLEAVED, rows=k)
    out = []
    for s in range(0, len(tokens), k):
        part = tokens[s:s + k]
        out.append(stepper.step([0] * len(part), part))
        m.tokens.extend(part)
    return np.concatenate(out)


def _check(m, prompt, tokens, ks):
    want = _sequential(m, prompt, tokens)
    for k in ks:
        got = _verified(m, prompt, tokens, k)
        same = [bool(np.array_equal(_bits(g), _bits(w))) for g, w in zip(got, want)]
        assert all(same), (k, same)


@pytest.mark.parametrize("name,kind,kv_type", [
    ("llama", "q4_1", "f32"), ("gemma3", "q4_0", "f32"), ("gemma3", "q8_0", "f16"),
    ("mistral-swa", "q4_0", "f16"), ("qwen3", "q4_0", "f32")])
def test_rows_of_one_sequence_are_the_decode_steps_logits(name, kind, kv_type, converted):
    """Tiny models whose sliding windows (16) wrap while the rows step: every position, k =
    2, 3, 5, 8 (several steps, the last one short)."""
    ids = [int(t) for t in reference(name)["input_ids"]]
    prompt = (ids * 4)[:11]
    rng = np.random.default_rng(1)
    m = _model(converted(name, kind), kv_type)
    tokens = [int(t) for t in rng.integers(0, m.args.vocab_size, 30)]
    _check(m, prompt, tokens, (2, 3, 5, 8))
    assert any(layer.written > layer.cap for layer in m.cache.layers if layer.window) \
        or name in ("llama", "qwen3")


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_default_model(kv_type):
    m = _model(smollm2(), kv_type)
    rng = np.random.default_rng(2)
    prompt = [int(t) for t in rng.integers(0, m.args.vocab_size, 40)]
    tokens = [int(t) for t in rng.integers(0, m.args.vocab_size, 24)]
    _check(m, prompt, tokens, (2, 4, 8) if kv_type == "f32" else (3,))


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_gemma3_270m(kv_type):
    m = _model(gemma3(), kv_type)
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(0, m.args.vocab_size, 30)]
    tokens = [int(t) for t in rng.integers(0, m.args.vocab_size, 16)]
    _check(m, prompt, tokens, (4, 5) if kv_type == "f32" else (8,))


def test_gemma3_270m_window_wraps():
    """Across the sliding window of 512: the spare slots keep every row's window whole."""
    m = _model(gemma3())
    rng = np.random.default_rng(4)
    window = max(layer.window for layer in m.cache.layers)
    prompt = [int(t) for t in rng.integers(0, m.args.vocab_size, window - 5)]
    tokens = [int(t) for t in rng.integers(0, m.args.vocab_size, 16)]
    _check(m, prompt, tokens, (8,))
    assert any(layer.written > layer.cap for layer in m.cache.layers if layer.window)


def test_rows_need_the_spare_slots(converted):
    """Without spare slots, rows that would overwrite a window's oldest slot are refused."""
    m = _model(converted("gemma3", "q4_0"), spare=0)
    m.forward(list(range(1, 15)), want="none")
    stepper = BatchDecoder(m, [m.cache], interleave=False, rows=4)
    with pytest.raises(ValueError, match="spare"):
        stepper.step([0] * 4, [1, 2, 3, 4])
    stepper.step([0], [1])  # one row is the decode step itself


def test_threads_raised_after_the_model_was_built(converted):
    """A model built on one thread, then numba given two (a caller's set_num_threads): the
    verify step runs on the worker count its buffers were sized for (it ran two workers
    over one worker's scratch, and hung), and its rows are still the decode step's."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one thread only")
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        m = _model(converted("llama", "q4_1"))
        numba.set_num_threads(2)
        rng = np.random.default_rng(5)
        prompt = [int(t) for t in rng.integers(0, m.args.vocab_size, 9)]
        tokens = [int(t) for t in rng.integers(0, m.args.vocab_size, 6)]
        _check(m, prompt, tokens, (3,))
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_rows_of_several_sequences_each_their_decode_steps_logits(kv_type, converted):
    """A server's step: runs of rows of two caches, consecutive or alternating, each row
    its sequence's single-step logits bit for bit (each run's rows attend in one pass over
    their cache: batch_step._attend_run)."""
    m = _model(converted("llama", "q4_1"), kv_type)
    rng = np.random.default_rng(6)
    V = m.args.vocab_size
    prompts = [[int(t) for t in rng.integers(0, V, n)] for n in (13, 30)]
    toks = [[int(t) for t in rng.integers(0, V, 9)] for _ in range(2)]
    want = [_sequential(m, p, t) for p, t in zip(prompts, toks)]
    m.reset()
    m.forward(prompts[1], want="none")
    second = m.new_cache()
    second.restore(m.cache.state())
    m.reset()
    m.forward(prompts[0], want="none")
    stepper = BatchDecoder(m, [m.cache, second], interleave=EXACT_INTERLEAVED, rows=8)
    done = [0, 0]
    for slots in ([0, 0, 0, 1, 1], [0, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 1]):
        tokens = []
        for s in slots:
            tokens.append(toks[s][done[s]])
            done[s] += 1
        got = stepper.step(slots, tokens)
        seen = [done[0] - slots.count(0), done[1] - slots.count(1)]
        for r, s in enumerate(slots):
            assert np.array_equal(_bits(got[r]), _bits(want[s][seen[s]])), (slots, r)
            seen[s] += 1
    assert done == [9, 9]
