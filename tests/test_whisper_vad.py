"""vad=True: the energy VAD (edgellm/audio/vad.py) on synthesized speech, silence and noise,
and transcription of the speech alone with times mapped back to the recording (the tiny
checkpoint, its decoding scripted where times are checked)."""

import numpy as np
import pytest
from conftest import FIXTURES, load_converted

from edgellm.audio import load_audio
from edgellm.audio.vad import PAD, SpeechAudio, speech_chunks

CLIPS = FIXTURES / "whisper"
RATE = 16000


def fox_at(seconds: float, total: float, noise: float = 0.0) -> np.ndarray:
    fox = load_audio(CLIPS / "fox.wav")
    x = np.zeros(int(total * RATE), np.float32)
    at = int(seconds * RATE)
    x[at:at + fox.size] = fox
    if noise:
        x += (noise * np.random.default_rng(0).standard_normal(x.size)).astype(np.float32)
    return x


def test_silence_and_noise_have_no_speech():
    rng = np.random.default_rng(1)
    assert speech_chunks(np.zeros(10 * RATE, np.float32)) == []
    assert speech_chunks((0.03 * rng.standard_normal(10 * RATE)).astype(np.float32)) == []
    assert speech_chunks(np.zeros(0, np.float32)) == []


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_speech_in_silence_or_noise_is_one_padded_chunk(noise):
    """fox.wav (3.1 s of speech) at 20 s of 43 s: one chunk holding it, within the 0.4 s
    padding either side, clean or under white noise at -30 dB."""
    fox = load_audio(CLIPS / "fox.wav")
    voiced = np.flatnonzero(np.abs(fox) > 0.01)
    first, last = 20 * RATE + voiced[0], 20 * RATE + voiced[-1]
    chunks = speech_chunks(fox_at(20, 43, noise))
    assert len(chunks) == 1
    (s, e), slack = chunks[0], int(0.1 * RATE)
    assert first - PAD - slack <= s <= first and last <= e <= last + PAD + slack


def test_times_in_the_speech_map_back_to_the_recording():
    x = np.arange(100 * RATE, dtype=np.float32)
    sp = SpeechAudio(x, [(10 * RATE, 12 * RATE), (50 * RATE, 53 * RATE)])
    assert sp.audio.size == 5 * RATE and sp.audio[0] == 10 * RATE
    assert sp.original(0.0) == 10.0 and sp.original(1.5) == 11.5
    assert sp.original(2.0) == 50.0 and sp.original(2.0, end=True) == 12.0  # a boundary
    assert sp.original(4.0) == 52.0 and type(sp.original(4.0)) is float  # JSON-ready


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    yield from load_converted(tmp_path_factory, FIXTURES / "whisper-tiny-random", threads=1)


def scripted(monkeypatch, tokens):
    from edgellm.transcribe import Transcriber

    calls = []

    def search(self, cross, prompt, max_new, timestamps, temperature, opts, rng):
        calls.append(temperature)
        return tokens, -0.1, 0.0

    monkeypatch.setattr(Transcriber, "search", search)
    return calls


def test_silence_is_not_decoded(llm, monkeypatch):
    calls = scripted(monkeypatch, [111, 5, 131])
    done = []
    segments, info = llm.transcribe(np.zeros(40 * RATE, np.float32), language="en", vad=True,
                                    progress=lambda a, b: done.append((a, b)))
    assert list(segments) == [] and calls == [] and info.duration == 40.0
    assert done == [(40.0, 40.0)]
    segments = list(llm.transcribe(np.zeros(40 * RATE, np.float32), language="en")[0])
    assert calls  # without the VAD the silence is decoded


def test_segments_keep_the_recordings_times(llm, monkeypatch):
    """Speech at 40 s of 60: one window of speech decoded; its segment <|0.00|>..<|0.40|>
    lands at the chunk's start in the recording."""
    scripted(monkeypatch, [111, 5, 131])  # 0.00 -> 0.40 s, then the window is done
    x = fox_at(40, 60)
    (start, _), = speech_chunks(x)
    done = []
    segments, info = llm.transcribe(x, language="en", vad=True,
                                    progress=lambda a, b: done.append(a))
    segments = list(segments)
    assert info.duration == 60.0
    assert [(s.start, s.end) for s in segments] == [
        (pytest.approx(start / RATE), pytest.approx(start / RATE + 0.4))]
    assert done and done[-1] == 60.0 and done == sorted(done)


def test_vad_must_be_a_flag(llm):
    from edgellm.errors import ArgumentError

    with pytest.raises(ArgumentError, match="vad must be True or False"):
        llm.transcribe(np.zeros(RATE, np.float32), vad="yes")
