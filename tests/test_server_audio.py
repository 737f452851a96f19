"""POST /v1/audio/transcriptions and /v1/audio/translations through the official `openai`
client, on the tiny random Whisper checkpoint (tests/fixtures/whisper-tiny-random: no
tokenizer, so each segment is given a text here, as in test_transcribe_cli.py) and the
clips of tests/fixtures/whisper: each response_format equal to what LLM.transcribe gives on
the same file and options; the bad uploads (not audio, empty, too large, a WAV header that
lies about its length, an unknown format, a model of another kind) answered 400/404/413 in
OpenAI's error shape; the model's own thread; `edgellm serve`'s refusals. One test on the
real whisper-base (fetched once, as test_whisper_realmodel.py does)."""

from __future__ import annotations

import io
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("python_multipart")
openai = pytest.importorskip("openai")

from conftest import FIXTURES, name_whisper_segments  # noqa: E402
from server_helpers import ThreadServer, request  # noqa: E402
from whisper_base import whisper_base  # noqa: E402

import edgellm  # noqa: E402
from edgellm.transcript_formats import Writer  # noqa: E402

CLIPS = FIXTURES / "whisper"
FOX = CLIPS / "fox.wav"
MAX_AUDIO = 3 << 20  # fox.wav is 98,962 bytes, long_clip 2,967,584


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    path = tmp_path_factory.mktemp("whisper") / "whisper-tiny.edgellm"
    convert(open_hf(FIXTURES / "whisper-tiny-random"), path, "f32", progress=False)
    return path


@pytest.fixture(scope="module")
def tiny(tiny_path):
    """The tiny model, decoding greedily (one beam, one sample at each temperature) unless
    told otherwise, here and in the server alike: its random weights never say the end
    token, so each window runs to its token limit at every temperature of the fallback."""
    import functools

    with edgellm.load(tiny_path, threads=1) as m:
        m.transcribe = functools.partial(type(m).transcribe, m, beam_size=1, best_of=1)
        yield m


@pytest.fixture(scope="module")
def server(smollm2, tiny):
    with edgellm.load(smollm2, context=512) as llm:
        s = ThreadServer(llm, audio=tiny, audio_id="whisper-tiny", max_audio_bytes=MAX_AUDIO)
        yield s
        s.stop()


@pytest.fixture(autouse=True)
def texts(monkeypatch):
    name_whisper_segments(monkeypatch)  # the tiny model has no tokenizer


def _subtitles(fmt: str, segments) -> str:
    w = Writer(fmt, io.StringIO(), plain=False)
    w.head()
    for s in segments:
        w.segment(s)
    return w.out.getvalue()


def _verbose(r, segments, info, task="transcribe"):
    """r (TranscriptionVerbose) against LLM.transcribe's segments and info: the language by
    its name, as OpenAI gives it (a translation's: english), and the usage by duration."""
    from edgellm.server.audio_languages import NAMES

    assert r.task == task
    assert r.language == ("english" if task == "translate" else NAMES[info.language])
    assert r.duration == pytest.approx(info.duration)
    if task == "transcribe":
        assert (r.usage.type, r.usage.seconds) == ("duration", pytest.approx(info.duration))
    assert r.text == "".join(s.text for s in segments).strip()
    assert [s.model_dump() for s in r.segments] == [
        {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text,
         "tokens": s.tokens, "temperature": s.temperature, "avg_logprob": s.avg_logprob,
         "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
        for s in segments]


def test_each_response_format_is_what_transcribe_gives(server, tiny):
    segments, info = tiny.transcribe(str(FOX))
    segments = list(segments)
    assert segments
    text = "".join(s.text for s in segments).strip()
    client = server.client()
    for fmt in ("json", "text", "srt", "vtt", "verbose_json"):
        with open(FOX, "rb") as f:
            r = client.audio.transcriptions.create(model="whisper-tiny", file=f,
                                                   response_format=fmt)
        if fmt == "json":
            assert r.text == text
            assert (r.usage.type, r.usage.seconds) == ("duration", pytest.approx(info.duration))
        elif fmt == "text":
            assert r == text + "\n"
        elif fmt in ("srt", "vtt"):
            assert r == _subtitles(fmt, segments)
            assert r.count(" --> ") == len(segments)
        else:
            _verbose(r, segments, info)


def test_options_are_passed_as_transcribe_takes_them(server, tiny):
    """language, temperature (above 0: that one, sampled; 0: the fallback schedule) and
    both timestamp granularities; translations set the task."""
    client = server.client()
    german = CLIPS / "german.wav"
    segments, info = tiny.transcribe(str(german), "de", temperature=0.5)
    segments = list(segments)  # the stream holds the model until it is consumed
    with open(german, "rb") as f:
        r = client.audio.transcriptions.create(model="whisper-tiny", file=f, language="de",
                                               temperature=0.5, response_format="verbose_json",
                                               timestamp_granularities=["word", "segment"])
    _verbose(r, segments, info)
    assert r.words == []  # without a tokenizer, no words (the real model: below)

    segments, info = tiny.transcribe(str(german), task="translate")
    segments = list(segments)
    with open(german, "rb") as f:
        r = client.audio.translations.create(model="whisper-tiny", file=f,
                                             response_format="verbose_json", temperature=0)
    _verbose(r, segments, info, task="translate")


def test_a_compressed_upload_is_decoded_as_the_api_decodes_it(server, tiny, tmp_path):
    """An mp3 (the audio extra: PyAV) gives what LLM.transcribe gives on its bytes."""
    from test_audio_formats import encode

    mp3 = encode(tmp_path, "mp3", "libmp3lame", 16000).read_bytes()
    segments, info = tiny.transcribe(mp3)
    segments = list(segments)
    r = server.client().audio.transcriptions.create(
        model="whisper-tiny", file=("speech.mp3", mp3), response_format="verbose_json")
    _verbose(r, segments, info)


def _refused(call, status: int, *words: str):
    with pytest.raises(openai.APIStatusError) as e:
        call()
    assert e.value.status_code == status
    err = e.value.body
    assert set(err) >= {"message", "type", "param", "code"}  # OpenAI's error shape
    for w in words:
        assert w in err["message"], err["message"]
    return err


def test_bad_uploads_are_refused_with_a_clear_message(server):
    client = server.client()
    fox = FOX.read_bytes()

    def send(data, name="clip.wav", **more):
        return lambda: client.audio.transcriptions.create(
            model=more.pop("model", "whisper-tiny"), file=(name, data), **more)

    err = _refused(send(b"these are notes, not audio", "notes.txt"), 400, "notes.txt",
                   "not a WAV file")
    assert err["param"] == "file"
    _refused(send(b""), 400, "clip.wav", "empty")
    _refused(send(fox[:5000]), 400, "claims 98918 bytes", "truncated")
    _refused(send(fox, response_format="xml"), 400, "response_format", "'xml'")
    _refused(send(fox, temperature=1.5), 400, "temperature")
    _refused(send(fox, response_format="json", timestamp_granularities=["word"]), 400,
             "verbose_json")
    _refused(send(fox, language="xx"), 400, "language")
    err = _refused(send(fox, model="smollm2"), 400, "'smollm2'", "chat model", "whisper-tiny")
    assert err["param"] == "model"
    _refused(send(fox, model="whisper-1"), 404, "'whisper-1'", "whisper-tiny")
    # beyond --max-audio-bytes: the file (the route's check), or the body (the middleware's)
    big = fox + bytes(MAX_AUDIO)
    _refused(send(big[:MAX_AUDIO + 1]), 413, f"larger than {MAX_AUDIO} bytes")
    _refused(send(big + bytes(MAX_AUDIO)), 413, "larger than")
    # not multipart at all
    status, _, body = request(server.url + "/v1/audio/transcriptions", {"model": "whisper-tiny"})
    assert status == 400 and b"multipart/form-data" in body
    # the other paths keep their own body limit
    status, _, _ = request(server.url + "/v1/chat/completions",
                           b"{" + b" " * (2 << 20) + b"}")
    assert status == 413


def test_a_transcription_runs_on_the_models_thread_not_the_event_loop(server, monkeypatch):
    from edgellm.transcribe import Transcriber

    segments, threads = Transcriber.segments, []

    def slow(self, *a, **k):
        threads.append(threading.current_thread().name)
        time.sleep(1.5)
        yield from segments(self, *a, **k)

    monkeypatch.setattr(Transcriber, "segments", slow)
    client, out = server.client(), {}
    t = threading.Thread(target=lambda: out.setdefault("r", client.audio.transcriptions.create(
        model="whisper-tiny", file=FOX.open("rb"))))
    t.start()
    while not threads:
        time.sleep(0.01)
    start = time.monotonic()
    status, _, _ = request(server.url + "/health", timeout=5)
    assert status == 200 and time.monotonic() - start < 1.0  # answered while it decodes
    t.join(30)
    assert out["r"].text.startswith("segment 0")
    assert threads == ["edgellm-whisper-tiny_0"]


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory) -> bytes:
    """fox.wav 30 times over: 93 s, 28 windows of the tiny model (whose random timestamps
    end each window early)."""
    import wave

    with wave.open(str(FOX), "rb") as w:
        params, frames = w.getparams(), w.readframes(w.getnframes())
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setparams(params)
        w.writeframes(frames * 30)
    return out.getvalue()


@pytest.fixture
def windows(monkeypatch):
    """The windows each transcription encodes, by its audio's length in frames, each one
    slowed down: a long clip's transcription takes a while (as whisper-base's would)."""
    from edgellm.transcribe import Transcriber

    window, seen = Transcriber.window, {}

    def slow(self, mel, seek):
        seen[mel.shape[1]] = seen.get(mel.shape[1], 0) + 1
        time.sleep(0.3)
        return window(self, mel, seek)

    monkeypatch.setattr(Transcriber, "window", slow)
    return seen


def test_a_stream_is_openais_transcript_events(server, tiny):
    """stream=true (json or text): a transcript.text.delta per segment, the deltas adding up
    to the text, then transcript.text.done with the text: what the openai client reads."""
    from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

    segments, _ = tiny.transcribe(str(FOX))
    texts = [s.text for s in segments]
    assert len(texts) > 1
    client = server.client()
    for fmt in ("json", "text"):
        with open(FOX, "rb") as f:
            events = list(client.audio.transcriptions.create(
                model="whisper-tiny", file=f, response_format=fmt, stream=True))
        *deltas, done = events
        assert all(isinstance(e, TranscriptionTextDeltaEvent) for e in deltas)
        assert isinstance(done, TranscriptionTextDoneEvent)
        assert [e.delta for e in deltas] == [texts[0].lstrip(), *texts[1:]]
        assert done.text == "".join(texts).strip() == "".join(e.delta for e in deltas)


def test_a_stream_in_a_format_openai_does_not_stream_is_refused(server):
    client = server.client()
    for fmt in ("srt", "vtt", "verbose_json"):
        err = _refused(lambda fmt=fmt: client.audio.transcriptions.create(
            model="whisper-tiny", file=FOX.open("rb"), response_format=fmt, stream=True),
            400, f"response_format {fmt} cannot be streamed", "json or text")
        assert err["param"] == "response_format"
    err = _refused(lambda: client.audio.transcriptions.create(
        model="whisper-tiny", file=FOX.open("rb"), extra_body={"stream": "maybe"}), 400,
        "stream must be true or false", "'maybe'")
    assert err["param"] == "stream"


def test_a_client_that_leaves_a_stream_ends_its_transcription(server, long_clip, windows):
    """The client closes the stream after the first delta (sent as the first window was
    decoded, not at the end): the decoding stops at the next window, not the clip's 28th,
    and the next request is answered (the model's one thread is free)."""
    client = server.client()
    stream = client.audio.transcriptions.create(model="whisper-tiny",
                                                file=("long.wav", long_clip), stream=True)
    first = next(iter(stream))
    assert first.type == "transcript.text.delta" and first.delta == "segment 0"
    stream.close()
    (frames,) = windows  # the long clip's
    at_close = windows[frames]
    assert at_close < 10
    r = client.audio.transcriptions.create(model="whisper-tiny", file=FOX.open("rb"))
    assert r.text.startswith("segment 0")
    assert windows[frames] <= at_close + 2, (at_close, windows)


def test_a_client_that_leaves_a_whole_answer_ends_its_transcription(server, long_clip,
                                                                    windows):
    """Not streamed: the client gives up (its timeout) while the long clip is decoded; the
    decoding stops at the next window and the next request is answered."""
    client = server.client()
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=1.5).audio.transcriptions.create(
            model="whisper-tiny", file=("long.wav", long_clip))
    (frames,) = windows
    at_close = windows[frames]
    r = client.audio.transcriptions.create(model="whisper-tiny", file=FOX.open("rb"))
    assert r.text.startswith("segment 0")
    assert windows[frames] <= at_close + 2, (at_close, windows)


def test_side_models_run_their_kernels_on_their_own_thread_count(tiny_path, tiny):
    """A model's worker runs parallel kernels on the model's threads, not on every core
    (numba's count is per thread): handed in, and loaded on first use."""
    import asyncio

    import numba

    from edgellm.server.engine import Settings
    from edgellm.server.models import Served

    assert numba.config.NUMBA_NUM_THREADS > 1, "needs two cores to tell the counts apart"

    async def counts():
        served = Served(Settings(model_id="x"),
                        opener=lambda path, kind: edgellm.load(path, threads=1))
        served.add("handed", llm=tiny, kind="audio")
        served.add("loaded", path=tiny_path, kind="audio")
        try:
            async with served.lease("loaded"):
                return [await served.call(n, numba.get_num_threads)
                        for n in ("handed", "loaded")]
        finally:
            served.close()

    assert asyncio.run(counts()) == [1, 1]


def test_without_an_audio_model_the_routes_say_how_to_get_one():
    from edgellm.server.audio_api import _model
    from edgellm.server.engine import Settings
    from edgellm.server.errors import APIError
    from edgellm.server.models import Served

    with pytest.raises(APIError) as e:
        _model(Served(Settings(model_id="x")), "whisper-1")
    assert e.value.status == 404 and "--audio-model" in e.value.message


def test_serve_refuses_a_whisper_chat_model_and_a_text_audio_model(tiny_path, smollm2,
                                                                   capsys):
    from edgellm import cli

    assert cli.main(["serve", "-m", str(tiny_path), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "is a speech-to-text model" in err and "--audio-model" in err
    assert "Traceback" not in err
    assert cli.main(["serve", "-m", str(smollm2), "--audio-model", str(smollm2),
                     "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "not a speech model" in err and "Traceback" not in err
    # several models, loaded on first use: the file's header is checked before serving
    assert cli.main(["serve", "-m", str(smollm2), "--max-memory", "8GB", "--audio-model",
                     str(smollm2), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "--audio-model" in err and "not a Whisper model" in err
    assert "Traceback" not in err


def test_edgellm_serve_audio_model(tiny_path, smollm2):
    """`edgellm serve --audio-model`: the model listed, a transcription, the upload bound."""
    import json

    from server_helpers import serve_subprocess

    proc, url = serve_subprocess(smollm2, "--audio-model", str(tiny_path), "--alias", "chat",
                                 "--max-audio-bytes", "120000", "-t", "1", wait=600)
    try:
        from openai import OpenAI

        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        cards = {m.id: m.kind for m in client.models.list().data}
        assert cards == {"chat": "chat", "whisper-tiny": "audio"}
        r = client.audio.transcriptions.create(model="whisper-tiny", file=FOX.open("rb"),
                                               response_format="verbose_json")
        assert r.duration == pytest.approx(FOX.stat().st_size / 2 / 16000, abs=0.01)
        with pytest.raises(openai.APIStatusError) as e:
            client.audio.transcriptions.create(model="whisper-tiny",
                                               file=("big.wav", bytes(130_000)))
        assert e.value.status_code == 413
        assert json.loads(e.value.response.text)["error"]["code"] == "request_too_large"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with whisper_base(tmp_path_factory, "f32") as llm:
        yield llm


def test_real_whisper_base_words_and_prompt(smollm2, base, monkeypatch):
    monkeypatch.undo()  # the real model has its tokenizer: its own texts
    segments, info = base.transcribe(str(FOX), "en", initial_prompt="Foxes and dogs.",
                                     word_timestamps=True)
    segments = list(segments)
    with edgellm.load(smollm2, context=512) as llm:
        s = ThreadServer(llm, audio=base, audio_id="whisper-base")
        try:
            with open(FOX, "rb") as f:
                r = s.client().audio.transcriptions.create(
                    model="whisper-base", file=f, language="en", prompt="Foxes and dogs.",
                    response_format="verbose_json", timestamp_granularities=["word", "segment"])
        finally:
            s.stop()
    _verbose(r, segments, info)
    assert r.language == "english" and "lazy dog" in r.text
    assert [(w.word, w.start, w.end) for w in r.words] == [
        (w.word.strip(), w.start, w.end) for seg in segments for w in seg.words]
