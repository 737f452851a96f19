"""The real whisper-base (CTranslate2 files, fetched once: tests/realmodel.py) converted to
f32: the encoder's output and the greedy tokens on synthesized speech against transformers'
WhisperForConditionalGeneration built from the same weights (tests/fixtures/whisper/
base.json, base-encoder.npz: scripts/make-whisper-fixtures.py), and its text."""

import json

import numpy as np
import pytest
from conftest import FIXTURES
from whisper_base import whisper_base

from edgellm.audio import load_audio, log_mel
from edgellm.audio.mel import window
from edgellm.errors import ModelKindError

CLIPS = FIXTURES / "whisper"
GREEDY = {"beam_size": 1, "temperature": 0.0}  # transformers' greedy search
REFS = json.loads((CLIPS / "base.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with whisper_base(tmp_path_factory, "f32") as llm:
        yield llm


@pytest.fixture(scope="module")
def base_q8(tmp_path_factory):
    with whisper_base(tmp_path_factory, "q8_0") as llm:
        yield llm


def test_a_beam_step_gives_each_beam_its_own_logits(base_q8):
    """B sequences' one-token step (beam search) gives each row the logits its sequence
    gets decoded alone, bit for bit: the q8_0 layers and head meet the B rows at once
    (the weights read once), each row summed as one row alone."""
    model = base_q8.model
    mel = window(log_mel(load_audio(CLIPS / "fox.wav")))
    cross = model.cross(model.encode(mel))
    prompts = [[50258, 50259, 50359, 50363, t] for t in (440, 383, 50364, 1012, 317)]
    caches = [model.new_cache(cross) for _ in prompts]
    alone = [model.decode(np.array(p), c)[0] for p, c in zip(prompts, caches)]
    step = model.new_cache(cross, batch=len(prompts))
    for b, c in enumerate(caches):  # then one more token each, alone and together
        step.k[:, b], step.v[:, b] = c.k[:, 0], c.v[:, 0]
        alone[b] = model.decode(np.array([13]), c)[0]
    step.length = caches[0].length - 1
    together = model.decode(np.full((len(prompts), 1), 13), step)
    assert np.array_equal(together, np.stack(alone))


def test_encoder_matches_transformers(base):
    with np.load(CLIPS / "base-encoder.npz") as z:
        ref, step = z["rows"], int(z["step"])
    enc = base.model.encode(window(log_mel(load_audio(CLIPS / "fox.wav"))))
    # float32 noise: transformers' own float32 output is 3.2e-4 from its float64 one here,
    # ours 8.2e-4 (at values up to 24, after layers whose outliers reach 400)
    assert np.abs(enc[::step] - ref).max() < 1.5e-3
    assert np.abs(enc[::step] - ref).max() / np.abs(ref).max() < 1e-4


@pytest.mark.parametrize("case", sorted(REFS))
def test_greedy_tokens_match_transformers(base, case):
    ref = REFS[case]
    language = ref["language"] if ref["task"] == "translate" else None
    segments, info = base.transcribe(CLIPS / f"{ref['clip']}.wav", language=language,
                                     task=ref["task"], without_timestamps=not ref["timestamps"],
                                     **GREEDY)
    segments = list(segments)
    assert info.language == ref["language"]
    assert [t for s in segments for t in s.tokens] == ref["tokens"]
    assert "".join(s.text for s in segments) == ref["text"]
    begin = base.packed.header["whisper"]["tokens"]["timestamp_begin"]
    for s in segments:  # each segment's times are its timestamp tokens'
        if ref["timestamps"]:
            assert s.start == (s.tokens[0] - begin) * 0.02 and s.tokens[-1] >= begin
            assert s.end == pytest.approx(min((s.tokens[-1] - begin) * 0.02, info.duration))


def test_long_audio_seeks_by_timestamps_as_transformers(base):
    """37 s (the clips twice over, with pauses): the second window starts where the first
    one's last complete segment ended; without conditioning on the previous text, as
    transformers' long-form generate (base-long.json). Its token stream also keeps each
    window's unfinished last timestamp, which is no segment's."""
    ref = json.loads((CLIPS / "base-long.json").read_text("utf-8"))["tokens"]
    gap = np.zeros(24000, np.float32)
    clips = ("fox", "umbrella", "noise", "german")
    audio = np.concatenate([x for c in clips for x in (load_audio(CLIPS / f"{c}.wav"), gap)] * 2)
    segments, info = base.transcribe(audio, language="en", condition_on_previous_text=False,
                                     **GREEDY)
    segments = list(segments)
    assert info.duration > 30 and len({s.seek for s in segments}) == 2
    begin = base.packed.header["whisper"]["tokens"]["timestamp_begin"]
    mine = [t for s in segments for t in s.tokens]
    assert [t for t in mine if t < begin] == [t for t in ref if t < begin]
    rest = iter(ref)
    assert all(t in rest for t in mine)  # a subsequence: the same timestamps, in order
    assert all(a.end <= b.start + 1e-9 for a, b in zip(segments, segments[1:]))


def test_silence_gives_no_segment_and_noise_none_past_the_end(base):
    """Silence: the no-speech probability over 0.6 with a low average log-probability skips
    the window (without the rule whisper-base says " you"). Noise: whisper-base repeats
    timestamped text to 28 s of a 5 s clip; nothing past the audio's end is a segment."""
    silence = np.zeros(16000 * 5, np.float32)
    assert list(base.transcribe(silence, language="en", **GREEDY)[0]) == []
    kept = list(base.transcribe(silence, language="en", no_speech_threshold=None, **GREEDY)[0])
    assert [s.text for s in kept] == [" you"]
    noise = (0.01 * np.random.default_rng(0).standard_normal(16000 * 5)).astype(np.float32)
    segments = list(base.transcribe(noise, no_speech_threshold=None, **GREEDY)[0])  # "nn"
    assert segments and all(s.start < s.end <= 5.0 for s in segments)


def test_generate_is_refused(base):
    with pytest.raises(ModelKindError, match="transcribes audio"):
        base.generate("Hello")


def test_beam_search_matches_openai(base):
    """Beam 5 (the default) on each clip's window: the tokens openai/whisper's
    BeamSearchDecoder chooses over transformers' logits on the same weights
    (base-beam.json: scripts/make-whisper-search-fixtures.py)."""
    refs = json.loads((CLIPS / "base-beam.json").read_text("utf-8"))
    for name, ref in refs.items():
        segments, info = base.transcribe(CLIPS / f"{name}.wav", temperature=0.0)
        segments = list(segments)
        assert info.language == ref["language"]
        assert [t for s in segments for t in s.tokens] == ref["tokens"], name
        n = len(ref["tokens"])
        assert segments[0].avg_logprob == pytest.approx(ref["sum_logprob"] / (n + 1), abs=1e-3)


def test_vad_transcribes_the_speech_alone_at_its_time(base):
    """fox.wav after 35 s of silence and white noise at -40 dB (two windows without the VAD):
    with vad=True one window of speech is decoded, the one its chunk alone gives (" The quick
    brown parts jump over the lazy dog.": the noise costs a word), and its segment starts
    where the speech does in the recording (within the 0.4 s padding)."""
    from edgellm.audio.vad import speech_chunks

    fox = load_audio(CLIPS / "fox.wav")
    rng = np.random.default_rng(0)
    x = np.concatenate([np.zeros(35 * 16000, np.float32), fox, np.zeros(5 * 16000, np.float32)])
    x += (0.01 * rng.standard_normal(x.size)).astype(np.float32)
    segments, info = base.transcribe(x, language="en", vad=True)
    segments = list(segments)
    (a, b), = speech_chunks(x)
    alone = list(base.transcribe(x[a:b], language="en")[0])
    assert "lazy dog" in alone[-1].text
    assert "".join(s.text for s in segments) == "".join(s.text for s in alone)
    assert 34.5 <= segments[0].start <= 35.2 and segments[-1].end <= 35 + fox.size / 16000 + 0.5
    assert {s.seek for s in segments} == {0} and info.duration == x.size / 16000


@pytest.mark.parametrize("clip", ["fox", "umbrella", "noise", "german"])
def test_word_timestamps_match_openai(base, clip):
    """Greedy segments with word_timestamps=True: each word's text, start, end (to the
    hundredth, as openai rounds them) and probability, and the segments' times after
    openai's clean-ups, as openai/whisper's add_word_timestamps gives them over
    transformers' cross-attention (base-words.json: scripts/make-whisper-word-fixtures.py)."""
    ref = json.loads((CLIPS / "base-words.json").read_text("utf-8"))[clip]
    segments, info = base.transcribe(CLIPS / f"{clip}.wav", word_timestamps=True, **GREEDY)
    segments = list(segments)
    assert info.language == ref["language"] and len(segments) == len(ref["segments"])
    for s, r in zip(segments, ref["segments"]):
        assert (s.start, s.end) == (pytest.approx(r["start"]), pytest.approx(r["end"]))
        assert [w.word for w in s.words] == [w["word"] for w in r["words"]]
        assert [(w.start, w.end) for w in s.words] == \
            [(pytest.approx(w["start"]), pytest.approx(w["end"])) for w in r["words"]]
        assert [w.probability for w in s.words] == \
            [pytest.approx(w["probability"], abs=2e-3) for w in r["words"]]


def test_word_timestamps_with_vad_and_in_the_cli(base, tmp_path, capsys):
    """With vad=True the words' times are the recording's too; the CLI's json has them."""
    from edgellm import cli
    from edgellm.audio.wav import write_wav

    fox = load_audio(CLIPS / "fox.wav")
    x = np.concatenate([np.zeros(35 * 16000, np.float32), fox])
    segments = list(base.transcribe(x, language="en", vad=True, word_timestamps=True)[0])
    words = [w for s in segments for w in s.words]
    assert [w.word for w in words][-2:] == [" lazy", " dog."]
    assert all(34.5 <= w.start <= w.end <= x.size / 16000 for w in words)
    path = tmp_path / "late.wav"
    write_wav(path, x, 16000)
    code = cli.main(["transcribe", "-m", str(base.packed.path), "-t", "1", "--format", "json",
                     "--vad", "--word-timestamps", str(path)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    got = [w for s in out["segments"] for w in s["words"]]
    assert [w["word"] for w in got] == [w.word for w in words]
    assert [w["start"] for w in got] == [round(w.start, 3) for w in words]
