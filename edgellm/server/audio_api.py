"""Speech to text in OpenAI's shape: an audio upload transcribed (or translated into
English) by the server's Whisper model (LLM.transcribe), on the model's own thread.

    add_routes(app, served)   POST /v1/audio/transcriptions, /v1/audio/translations

    request (multipart/form-data): file (the audio: WAV; mp3, m4a, ogg, flac, webm with the
        audio extra), model, language?, prompt? (the initial prompt), response_format?
        (json | text | srt | verbose_json | vtt; default json), temperature? (0..1),
        timestamp_granularities[]? (segment, word: with verbose_json), stream? (true: with
        json or text)
    response: json {"text", "usage"}; text: the text and a newline; srt, vtt: the subtitles
        as `edgellm transcribe` writes them; verbose_json {"task", "language" (its name:
        "english"), "duration", "text", "segments": [{"id", "seek", "start", "end", "text",
        "tokens", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob"}],
        "words"?: [{"word", "start", "end"}], "usage"}; usage {"type": "duration", "seconds"}
        (transcriptions: OpenAI's Transcription and TranscriptionVerbose types)
    stream=true: server-sent events as OpenAI's streaming transcriptions send them, each
        window's segments as soon as it is decoded: {"type": "transcript.text.delta",
        "delta"} per segment (the deltas add up to the text), then {"type":
        "transcript.text.done", "text"} and `data: [DONE]`. OpenAI streams json and text
        only; stream with srt, vtt or verbose_json is answered 400 (param response_format).

temperature follows OpenAI's meaning: 0 (the default) decodes at 0 (beam search, 5 beams)
and falls back through 0.2 ... 1.0 while a window looks wrong (openai/whisper's schedule,
LLM.transcribe's default); above 0, that one temperature is sampled, without fallback.
verbose_json's "language" is the name OpenAI gives the language the model detected or was
given (audio_languages.py); a translation's is "english" (OpenAI's TranslationVerbose).
A client that leaves ends its transcription at the next segment or window (audio_run.py),
streamed or not. The upload is bounded by Settings.max_audio_bytes (413 beyond; the body
limit of these paths is raised to match: body_bounds); a file that is empty, not audio, or
a WAV whose header claims more data than it holds is answered 400.
"""

from __future__ import annotations

import functools
import io
import math

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile

from ..errors import AudioError, EdgeLLMError
from .audio_languages import name as language_name
from .audio_run import Run
from .engine import Settings
from .errors import APIError, from_edgellm
from .models import Served
from .streaming import sse

PATHS = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
STREAMED = ("json", "text")  # the formats OpenAI streams
CLIENT_LEFT = 499  # the status logged for a request whose client left (nginx's)
GRANULARITIES = ("segment", "word")
FORM_SLACK = 64 << 10  # bytes of a body beside the upload: the other fields, the framing
MAX_FIELDS = 32
FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature"}


def body_bounds(settings: Settings) -> dict[str, int]:
    """The body limit of the audio paths (Limits' `larger`): an upload and its fields."""
    if settings.audio_id is None:
        return {}
    return dict.fromkeys(PATHS, settings.max_audio_bytes + FORM_SLACK)


def add_routes(app: FastAPI, served: Served) -> None:
    @app.post("/v1/audio/transcriptions")
    @app.post("/v1/audio/translations")
    async def audio(request: Request):
        task = PATHS[request.url.path]
        name = _model(served, None)  # 404 at once when the server has no speech model
        if "multipart/form-data" not in request.headers.get("content-type", ""):
            raise APIError(400, "send the audio as multipart/form-data (fields: file, model, "
                           "language, prompt, response_format, temperature, stream)",
                           param="file")
        form = await request.form(max_files=1, max_fields=MAX_FIELDS)
        try:
            ask = _Ask(form, served.settings.max_audio_bytes)
            data = await ask.read()
        finally:
            await form.close()
        name = _model(served, ask.model)
        # the run takes its own lease (the Leases middleware reads JSON bodies only), held
        # until the model's thread is done with it, a stream's end included
        run = Run(served, name, functools.partial(_decode, data=data, task=task, ask=ask))
        try:
            info = await _next(run, request, ask)  # a bad upload: an error status, not a stream
            if info is None:
                return Response(status_code=CLIENT_LEFT)
            if ask.stream:
                response = sse(_deltas(run, ask), FIELDS, lambda e, _: _api_error(e, ask))
                response.background = BackgroundTask(run.stop)  # if the body never started
                return response
            segments = []
            while (segment := await _next(run, request, ask)) is not None:
                segments.append(segment)
            if run.left:
                return Response(status_code=CLIENT_LEFT)
        except BaseException:
            run.stop()
            raise
        return _response(ask, task, segments, info)


class _Ask:
    """A request's form fields, checked (400 naming the field)."""

    def __init__(self, form, max_bytes: int):
        self.upload, self.max_bytes = form.get("file"), max_bytes
        if not isinstance(self.upload, UploadFile):
            got = "missing" if self.upload is None else "a text field, not a file"
            raise APIError(400, f"file: give the audio as an uploaded file (got {got})",
                           param="file")
        self.filename = self.upload.filename or "upload"
        self.model = _field(form, "model")
        self.language = _field(form, "language")
        self.prompt = _field(form, "prompt")
        self.format = _field(form, "response_format") or "json"
        if self.format not in FORMATS:
            raise APIError(400, f"response_format must be one of {', '.join(FORMATS)}, got "
                           f"{self.format!r:.40}", param="response_format")
        self.temperature = _temperature(_field(form, "temperature"))
        kinds = [k for key in ("timestamp_granularities[]", "timestamp_granularities")
                 for k in form.getlist(key)]
        bad = [k for k in kinds if k not in GRANULARITIES]
        if bad:
            raise APIError(400, f"timestamp_granularities: each must be segment or word, got "
                           f"{str(bad[0])!r:.40}", param="timestamp_granularities")
        if kinds and self.format != "verbose_json":
            raise APIError(400, "timestamp_granularities needs response_format verbose_json",
                           param="timestamp_granularities")
        self.words = "word" in kinds
        self.segments = not kinds or "segment" in kinds
        stream = (_field(form, "stream") or "false").lower()
        if stream not in ("true", "false", "1", "0"):
            raise APIError(400, f"stream must be true or false, got {stream!r:.40}",
                           param="stream")
        self.stream = stream in ("true", "1")
        if self.stream and self.format not in STREAMED:
            raise APIError(400, f"response_format {self.format} cannot be streamed: with "
                           "stream=true ask for json or text (transcript.text.delta events), "
                           f"or drop stream for {self.format}", param="response_format")

    async def read(self) -> bytes:
        """The upload's bytes: 413 beyond max_bytes, 400 when empty."""
        data = await self.upload.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise APIError(413, f"file ({self.filename}) is larger than {self.max_bytes} bytes "
                           "(the server's --max-audio-bytes)", param="file",
                           code="request_too_large")
        if not data:
            raise APIError(400, f"file ({self.filename}) is empty", param="file")
        return data


def _field(form, key: str) -> str | None:
    """A text field ("" counts as not given), 400 if it came as a file."""
    value = form.get(key)
    if isinstance(value, UploadFile):
        raise APIError(400, f"{key}: give text, not a file", param=key)
    return value or None


def _temperature(text: str | None) -> tuple[float, ...] | None:
    """OpenAI's temperature: 0 (or none) -> the fallback schedule (None: the default)."""
    if text is None:
        return None
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not 0 <= t <= 1:
        raise APIError(400, f"temperature must be a number in [0, 1], got {text!r:.40}",
                       param="temperature")
    return None if t == 0 else (t,)


def _model(served: Served, name: str | None) -> str:
    """The speech model `name` names (None: the first one): 404 when none is served or
    `name` is not, 400 when `name` is a model of another kind."""
    ids = [k for k, m in served.models.items() if m.kind == "audio"]
    if not ids:
        raise APIError(404, "no speech-to-text model is loaded (start the server with "
                       "--audio-model MODEL, e.g. whisper-base)", "not_found_error", "model",
                       "model_not_found")
    m = served.models.get(name) if name is not None else served.models[ids[0]]
    if m is None:
        raise APIError(404, f"model {name!r} is not served here (speech to text: "
                       f"{', '.join(ids)})", "not_found_error", "model", "model_not_found")
    if m.kind != "audio":
        raise APIError(400, f"model {name!r} is a {m.kind} model, not a speech-to-text one "
                       f"(this server transcribes with {', '.join(ids)})", param="model",
                       code="model_not_supported")
    return m.name


def _decode(llm, progress, data: bytes, task: str, ask: _Ask):
    """(segments, info) of the upload (on the model's thread: audio_run.Run)."""
    more = {} if ask.temperature is None else {"temperature": ask.temperature}
    return llm.transcribe(data, ask.language, task, initial_prompt=ask.prompt,
                          word_timestamps=ask.words, progress=progress, **more)


def _api_error(e: EdgeLLMError, ask: _Ask) -> APIError:
    if isinstance(e, AudioError):
        msg = " ".join(str(e).split()).removeprefix("audio: ")
        return APIError(400, f"file ({ask.filename}): {msg}", param="file")
    return from_edgellm(e, FIELDS)


async def _next(run: Run, request: Request, ask: _Ask):
    """The run's next item (None: the end, or the client left), its errors as API errors."""
    try:
        return await run.next(request)
    except EdgeLLMError as e:
        raise _api_error(e, ask) from None


async def _deltas(run: Run, ask: _Ask):
    """OpenAI's transcription stream events: a delta per segment, then the whole text. The
    deltas add up to the text exactly: the first is stripped on the left, and each one's
    trailing blanks go out at the start of the next (the text is stripped at the end)."""
    texts, held, sent = [], "", False
    try:
        while (segment := await run.next()) is not None:
            texts.append(segment.text)
            delta = held + segment.text if sent else segment.text.lstrip()
            body = delta.rstrip()
            held = delta[len(body):]
            if body:
                sent = True
                yield {"type": "transcript.text.delta", "delta": body}
        yield {"type": "transcript.text.done", "text": "".join(texts).strip()}
    finally:  # the client left (Starlette cancels the body) or the stream ended
        run.stop()


def _response(ask: _Ask, task: str, segments: list, info):
    from ..transcript_formats import Writer

    text = "".join(s.text for s in segments).strip()
    # billed by duration, as whisper-1 is (OpenAI's translation types have no usage)
    usage = {"usage": {"type": "duration", "seconds": float(info.duration)}} \
        if task == "transcribe" else {}
    if ask.format == "json":
        return JSONResponse({"text": text, **usage})
    if ask.format == "text":
        return PlainTextResponse(text + "\n")
    if ask.format in ("srt", "vtt"):
        w = Writer(ask.format, io.StringIO(), plain=False)
        w.head()
        for s in segments:
            w.segment(s)
        return PlainTextResponse(w.out.getvalue())
    language = "english" if task == "translate" else language_name(info.language)
    body = {"task": task, "language": language, "duration": float(info.duration),
            "text": text}
    if ask.segments:
        body["segments"] = [
            {"id": s.id, "seek": int(s.seek), "start": float(s.start), "end": float(s.end),
             "text": s.text, "tokens": [int(t) for t in s.tokens],
             "temperature": float(s.temperature), "avg_logprob": float(s.avg_logprob),
             "compression_ratio": float(s.compression_ratio),
             "no_speech_prob": float(s.no_speech_prob)}
            for s in segments]
    if ask.words:
        body["words"] = [{"word": w.word.strip(), "start": float(w.start), "end": float(w.end)}
                         for s in segments for w in s.words or ()]
    return JSONResponse({**body, **usage})
