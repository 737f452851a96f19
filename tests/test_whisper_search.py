"""Whisper's decoding beyond greedy on the tiny random checkpoint: beam search against
openai/whisper's own BeamSearchDecoder (tests/fixtures/whisper-tiny-random/beam.json,
scripts/make-whisper-search-fixtures.py), sampling at a temperature, the temperature
fallback's rules, and the refusals."""

import json

import numpy as np
import pytest
from conftest import FIXTURES

import edgellm
from edgellm.audio import load_audio, log_mel
from edgellm.errors import ArgumentError

TINY = FIXTURES / "whisper-tiny-random"
CLIPS = FIXTURES / "whisper"
BEAMS = json.loads((TINY / "beam.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    path = tmp_path_factory.mktemp("whisper") / "tiny.edgellm"
    convert(open_hf(TINY), path, "f32", progress=False)
    with edgellm.load(path, threads=1) as m:
        yield m


@pytest.fixture(scope="module")
def t(llm):
    from edgellm.transcribe import Transcriber

    return Transcriber(llm)


@pytest.fixture(scope="module")
def windows(t):
    return {c: t.window(log_mel(load_audio(CLIPS / f"{c}.wav")), 0) for c in ("fox", "german")}


@pytest.mark.parametrize("case", sorted(BEAMS))
def test_beam_search_matches_openai(t, windows, case):
    from edgellm.transcribe import Options

    ref = BEAMS[case]
    opts = Options(beam_size=ref["beam_size"], patience=ref["patience"],
                   length_penalty=ref["length_penalty"])
    prompt = t.prompt("en", "transcribe", ref["timestamps"], [])
    tokens, total, _ = t.search(windows[ref["clip"]], prompt, 20, ref["timestamps"], 0.0, opts,
                                np.random.default_rng(0))
    assert tokens == ref["tokens"]
    assert total == pytest.approx(ref["sum_logprob"], abs=1e-3)


def test_sampling_is_seeded_and_cold_sampling_is_greedy(t, windows):
    from edgellm.transcribe import Options

    prompt = t.prompt("en", "transcribe", True, [])
    cross = windows["fox"]
    opts = Options(best_of=3)

    def hot(seed):
        return t.search(cross, prompt, 12, True, 0.8, opts, np.random.default_rng(seed))[:2]

    assert hot(1) == hot(1) and hot(1) != hot(2)
    greedy = t.greedy(cross, prompt, 12, True)
    cold = t.search(cross, prompt, 12, True, 1e-4, Options(best_of=2), np.random.default_rng(0))
    assert cold[0] == greedy[0] and cold[1] == pytest.approx(greedy[1], abs=1e-4)


def test_top_is_a_stable_argsorts_first_k():
    """Beam search's candidates without sorting the vocabulary: ties by index, -inf too."""
    from edgellm.kernels.whisper_decode import _top

    rng = np.random.default_rng(3)
    for _ in range(500):
        x = rng.integers(-3, 3, size=int(rng.integers(1, 40))).astype(np.float32)
        x[rng.random(x.size) < 0.3] = -np.inf
        k = int(rng.integers(1, min(8, x.size) + 1))
        idx = np.empty(k, np.int64)
        _top(x, k, idx)
        assert idx.tolist() == np.argsort(-x, kind="stable")[:k].tolist()


def test_the_rules_kernel_is_the_numpy_rules(t):
    """Transcriber.rules (one kernel over float32 rows) against Transcriber.filters (numpy,
    float64) on random logits after random histories: the same entries suppressed, the
    same best tokens in the same order, log-probabilities within 1e-6."""
    from edgellm.transcribe import _logsumexp

    rng = np.random.default_rng(5)
    begin, V = t.meta.tokens["timestamp_begin"], t.model.args.vocab_size
    for case in range(300):
        rows = (rng.standard_normal((3, V)) * 3).astype(np.float32)
        rows[:, begin:] += rng.uniform(-4, 6, (3, 1)).astype(np.float32)  # either may win
        n = int(rng.integers(0, 5))
        hist = np.where(rng.random((3, n)) < 0.4, rng.integers(begin, V, (3, n)),
                        rng.integers(0, begin - 10, (3, n)))
        timestamps, k = case % 4 != 0, int(rng.integers(1, 7))
        want = rows.astype(np.float64)
        for row, h in zip(want, hist):
            t.filters(row, h.tolist(), timestamps)
        idx, logp = t.rules(rows, hist.astype(np.int64), k, timestamps)
        assert np.array_equal(np.isinf(rows), np.isinf(want))
        for b in range(3):
            best = np.argsort(-want[b], kind="stable")[:k]
            assert idx[b].tolist() == best.tolist()
            ref = want[b][best] - _logsumexp(want[b])
            assert np.allclose(logp[b], ref, atol=1e-6, rtol=0) or \
                np.array_equal(logp[b], ref)  # -inf where every entry is


def test_sampling_draws_from_the_tempered_distribution():
    """One sequence, a fixed row: the first token's frequencies are softmax(row / t), and
    the summed log-probability is the untempered one."""
    from edgellm.transcribe_search import sample

    row = np.log(np.array([0.6, 0.3, 0.1, 1e-9]))  # token 3 ends
    rng, counts, t = np.random.default_rng(0), np.zeros(4), 2.0
    for _ in range(4000):
        tokens, total = sample(row, lambda ids: np.repeat(row[None], len(ids), 0),
                               lambda r, seq: None, 3, 1, t, 1, rng)
        counts[tokens[0]] += 1
        assert total == pytest.approx(np.log([0.6, 0.3, 0.1])[tokens[0]] - np.log(1 + 1e-9))
    want = np.exp(row[:3] / t) / np.exp(row / t).sum()
    assert np.abs(counts[:3] / counts.sum() - want).max() < 0.03


def scripted(monkeypatch, results):
    """Transcriber.search answers from `results` {temperature: (tokens, total,
    no_speech)}, recording (temperature, prompt) of each call."""
    from edgellm.transcribe import Transcriber

    calls = []

    def search(self, cross, prompt, max_new, timestamps, temperature, opts, rng):
        calls.append((temperature, list(prompt)))
        return results[temperature]

    monkeypatch.setattr(Transcriber, "search", search)
    return calls


def test_a_window_too_unlikely_is_decoded_again_hotter(llm, monkeypatch):
    calls = scripted(monkeypatch, {0.0: ([5, 6, 7], -8.0, 0.0), 0.2: ([8, 9], -0.9, 0.0)})
    segments = list(llm.transcribe(np.zeros(16000, np.float32), language="en",
                                   without_timestamps=True)[0])
    assert [c[0] for c in calls] == [0.0, 0.2]
    assert [(s.tokens, s.temperature) for s in segments] == [([8, 9], 0.2)]
    assert segments[0].avg_logprob == pytest.approx(-0.3)


def test_silence_is_not_decoded_again(llm, monkeypatch):
    calls = scripted(monkeypatch, {0.0: ([5], -8.0, 0.9)})
    assert list(llm.transcribe(np.zeros(16000, np.float32), language="en")[0]) == []
    assert [c[0] for c in calls] == [0.0]


def test_a_repetitive_window_tries_every_temperature_and_keeps_the_last(t, monkeypatch):
    """Compression ratio over 2.4 at every temperature: openai/whisper keeps the last."""
    from edgellm.transcribe import Options

    calls = scripted(monkeypatch, {x: ([5, 6], -0.1, 0.0) for x in (0.0, 0.5, 1.0)})
    opts = Options(temperatures=(0.0, 0.5, 1.0))
    out = t.decode_window(None, [], 10, True, opts, None, lambda ids: "la " * 40)
    assert [c[0] for c in calls] == [0.0, 0.5, 1.0] and out[-1] == 1.0 and out[-2] > 2.4
    calls.clear()
    out = t.decode_window(None, [], 10, True, opts, None, lambda ids: "a different text")
    assert [c[0] for c in calls] == [0.0] and out[-1] == 0.0


def test_a_window_sampled_hot_is_not_the_next_ones_prompt(llm, monkeypatch):
    """prompt_reset_on_temperature (0.5): after a window decoded at 0.6 the next window's
    prompt has no previous text (35 s: two windows)."""
    calls = scripted(monkeypatch, {0.0: ([5, 6], -9.0, 0.0), 0.6: ([8, 9], -0.1, 0.0)})
    audio = np.zeros(16000 * 35, np.float32)
    list(llm.transcribe(audio, language="en", without_timestamps=True,
                        temperature=(0.0, 0.6))[0])
    prompts = [p for x, p in calls if x == 0.0]
    assert len(prompts) == 2 and all(p[0] == 101 for p in prompts)  # sot: no <|startofprev|>
    calls.clear()
    list(llm.transcribe(audio, language="en", without_timestamps=True,
                        temperature=(0.0, 0.4), log_prob_threshold=None)[0])
    assert calls[1][1][:3] == [108, 5, 6]  # <|startofprev|> and the first window's tokens


@pytest.mark.parametrize("kw, match", [
    ({"beam_size": 0}, "beam_size must be in 1..64"),
    ({"best_of": "5"}, "best_of must be an int"),
    ({"patience": 0}, "patience must be a number"),
    ({"temperature": []}, "temperature must be a number in"),
    ({"temperature": (0.0, -0.2)}, "temperature must be a number in"),
    ({"length_penalty": "x"}, "length_penalty must be a number"),
    ({"compression_ratio_threshold": -1}, "compression_ratio_threshold must be a number"),
    ({"seed": -1}, "seed must be"),
])
def test_bad_options_are_refused(llm, kw, match):
    with pytest.raises(ArgumentError, match=match):
        llm.transcribe(CLIPS / "fox.wav", **kw)
