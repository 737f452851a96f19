"""The KV cache takes a verify step's rejected rows back (KVCache.take_back): decoding then
goes on bit for bit as if they had never run (ring buffers and sliding windows that
wrapped, f16 / q8_0 caches), and what a generation leaves behind (the token list, the
prompt cache, a saved session) holds no rejected token."""

import numpy as np
import pytest
from conftest import reference
from speculative_models import smollm2

import edgellm
from edgellm import loader
from edgellm.modelfile.format import PackedModel
from edgellm.speculative.verify import Verifier

DOC = ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n")
ASK = [{"role": "user", "content": "Rename area to rect_area and give back all the code:\n"
        + DOC}]


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _decode(m, tokens):
    return np.stack([m.forward([t], want="last").copy() for t in tokens])


def _consistent(m):
    """The cache holds model.tokens: positions 0..n-1 (a sliding layer: at least its
    window's), nothing after."""
    n = len(m.tokens)
    assert m.cache.next_pos == m.cache.n_tokens == n
    for layer in m.cache.layers:
        live = np.sort(layer.pos[layer.pos >= 0])
        assert layer.written == n
        if not layer.window:
            assert np.array_equal(live, np.arange(n))
            continue
        assert live.size == 0 or (live[0] >= n - layer.cap and live[-1] == n - 1)
        assert set(range(max(0, n - layer.window + 1), n)) <= set(live.tolist())


@pytest.mark.parametrize("name,kind,kv_type", [
    ("gemma3", "q4_0", "f32"), ("gemma3", "q8_0", "f16"), ("mistral-swa", "q4_0", "f16"),
    ("llama", "q4_1", "f32")])
def test_rejected_rows_taken_back_tiny(name, kind, kv_type, converted):
    """Windows of 16 wrapping while rows are taken back: 6 rows, the last 4 rejected, at
    each of 8 steps; decoding afterwards is the plain decode's, bit for bit."""
    ids = [int(t) for t in reference(name)["input_ids"]]
    prompt = (ids * 4)[:10]
    m = loader.build(PackedModel(converted(name, kind)), kv_type=kv_type, kv_spare=7)
    rng = np.random.default_rng(5)
    kept, after = [], [int(t) for t in rng.integers(0, m.args.vocab_size, 6)]
    m.forward(prompt, want="none")
    v = Verifier(m, 8)
    for _ in range(8):
        rows = [int(t) for t in rng.integers(0, m.args.vocab_size, 6)]
        v.run(rows)
        m.take_back(4)
        kept += rows[:2]
        _consistent(m)
    got = _decode(m, after)
    m.reset()
    m.forward(prompt, want="none")
    _decode(m, kept)
    want = _decode(m, after)
    assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_rejected_rows_taken_back_default_model(kv_type):
    m = loader.build(PackedModel(smollm2()), kv_type=kv_type, kv_spare=7)
    rng = np.random.default_rng(6)
    prompt = [int(t) for t in rng.integers(0, m.args.vocab_size, 20)]
    rows = [int(t) for t in rng.integers(0, m.args.vocab_size, 8)]
    after = [int(t) for t in rng.integers(0, m.args.vocab_size, 3)]
    m.forward(prompt, want="none")
    Verifier(m, 8).run(rows)
    m.take_back(5)
    _consistent(m)
    got = _decode(m, after)
    ref = loader.build(PackedModel(smollm2()), kv_type=kv_type)
    ref.forward(prompt, want="none")
    _decode(ref, rows[:3])
    assert np.array_equal(_bits(got), _bits(_decode(ref, after)))


def test_take_back_refuses_more_than_written(converted):
    m = loader.build(PackedModel(converted("llama", "q4_1")), kv_spare=7)
    m.forward([1, 2, 3], want="none")
    with pytest.raises(ValueError, match="take back"):
        m.cache.take_back(4)


def test_stopped_generation_leaves_no_guess_behind(tmp_path):
    """A stop string ends the answer mid-verify: the cache and the token list hold what
    plain decoding's hold (the prompt and the tokens run), a saved session the same."""
    with edgellm.load(smollm2(), draft="lookup") as spec, edgellm.load(smollm2()) as plain:
        outs = []
        for llm in (spec, plain):
            with llm.stream(ASK, max_tokens=60, stop=["perimeter"]) as chunks:
                outs.append([c.token for c in chunks])
            _consistent(llm.model)
            llm.save_session(tmp_path / f"{len(outs)}.session")
        assert outs[0] == outs[1]
        assert spec.model.tokens == plain.model.tokens
        a, b = spec.model.cache.state(), plain.model.cache.state()
        for x, y in zip(a.k + a.v + a.pos, b.k + b.v + b.pos):
            assert np.array_equal(x, y)
        s1 = (tmp_path / "1.session").read_bytes()
        loaded = plain.load_session(tmp_path / "1.session")
        assert loaded.tokens == spec.model.tokens and len(s1) > 0


def test_prompt_cache_reuse_after_speculation():
    """The prompt cache snapshots only run tokens: a second request sharing the first's
    prefix reuses it and answers as plain decoding does."""
    with edgellm.load(smollm2(), draft="lookup", prompt_cache_bytes=64 << 20) as spec, \
            edgellm.load(smollm2()) as plain:
        for follow in ("Now rename perimeter to rect_perimeter.", "Thanks!"):
            msgs = ASK + [{"role": "assistant", "content": DOC},
                          {"role": "user", "content": follow}]
            a = spec.generate(msgs, max_tokens=40)
            b = plain.generate(msgs, max_tokens=40)
            assert a == b
            _consistent(spec.model)
