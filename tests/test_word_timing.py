"""The pieces of word timing (edgellm/word_timing.py) against direct computations: the
median filter, dynamic time warping, the word split; and word_timestamps on the tiny
checkpoint (no tokenizer: no words). Against openai/whisper's own timing.py on whisper-base:
tests/test_whisper_realmodel.py."""

import itertools

import numpy as np
import pytest
from conftest import FIXTURES

import edgellm
from edgellm.word_timing import Word, dtw, median_filter, merge_punctuations, split_words


def test_median_filter_is_a_reflect_padded_running_median():
    x = np.random.default_rng(0).standard_normal((2, 3, 20))
    got = median_filter(x, 7)
    xp = np.pad(x, ((0, 0), (0, 0), (3, 3)), mode="reflect")
    want = np.stack([np.median(xp[..., i:i + 7], axis=-1) for i in range(20)], axis=-1)
    np.testing.assert_array_equal(got, want)
    assert median_filter(x[..., :3], 7) is not None  # too short: unchanged


def brute_force(x):
    """The cheapest monotonic path's cost over every path (small x only)."""
    N, M = x.shape
    best = np.inf
    for steps in itertools.product((0, 1, 2), repeat=N + M):
        i = j = 0
        cost = x[0, 0]
        for s in steps:
            if (i, j) == (N - 1, M - 1):
                break
            di, dj = {0: (1, 1), 1: (1, 0), 2: (0, 1)}[s]
            i, j = i + di, j + dj
            if i >= N or j >= M:
                cost = np.inf
                break
            cost += x[i, j]
        if (i, j) == (N - 1, M - 1):
            best = min(best, cost)
    return best


def test_dtw_finds_the_cheapest_monotonic_path():
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.random((3, 5))
        rows, cols = dtw(x)
        assert rows[0] == cols[0] == 0 and rows[-1] == 2 and cols[-1] == 4
        assert np.all(np.diff(rows) >= 0) and np.all(np.diff(cols) >= 0)
        assert x[rows, cols].sum() == pytest.approx(brute_force(x))


def test_words_split_at_spaces_and_whole_characters():
    """A byte-level vocabulary: ids 0..3 spell " Hé" (é in two tokens), "llo", ",", " you".
    """
    pieces = {0: b" H", 1: b"\xc3", 2: b"\xa9llo", 3: b",", 4: b" you"}
    eot = 9

    def decode(ids):
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    words, groups = split_words([0, 1, 2, 3, 4, eot], eot, decode, "en")
    assert words == [" Hé" + "llo", ",", " you", "<|endoftext|>"]
    assert groups == [[0, 1, 2], [3], [4], [eot]]
    words, _ = split_words([0, 1, 2, 3, 4, eot], eot, decode, "ja")  # no spaces: characters
    assert words == [" H", "éllo", ",", " you", "<|endoftext|>"]


def test_punctuation_joins_its_word():
    ws = [Word(" (", 0, 1, 1, [1]), Word(" yes", 1, 2, 1, [2]), Word(".", 2, 3, 1, [3])]
    merge_punctuations(ws)
    assert [w.word for w in ws] == ["", " ( yes.", ""] and ws[1].tokens == [1, 2, 3]


def test_tiny_model_without_a_tokenizer_has_no_words(tmp_path):
    from converter.hf_source import open_hf
    from converter.pack import convert
    from edgellm.errors import ArgumentError

    path = tmp_path / "tiny.edgellm"
    convert(open_hf(FIXTURES / "whisper-tiny-random"), path, "f32", progress=False)
    with edgellm.load(path, threads=1) as llm:
        segments = list(llm.transcribe(FIXTURES / "whisper" / "fox.wav", language="en",
                                       word_timestamps=True, beam_size=1, temperature=0.0,
                                       max_new_tokens=8, no_speech_threshold=None)[0])
        assert segments and all(s.words == [] for s in segments)
        with pytest.raises(ArgumentError, match="word_timestamps must be True or False"):
            llm.transcribe(FIXTURES / "whisper" / "fox.wav", word_timestamps="yes")
