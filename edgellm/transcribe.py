"""Speech to text with a Whisper model: `LLM.transcribe(audio)` -> (segments, info).

    samples = load_audio(audio)                   WAV path / bytes or float32 array, 16 kHz
    mel = log_mel(samples)                        the whole input (audio/mel.py)
    per 30 s window (3,000 frames, the last one padded with zeros after normalization):
      enc = encode(window); cross keys/values once
      language = argmax over the language tokens after <|startoftranscript|> (if not given)
      tokens = greedy after [sot, language, task, <|notimestamps|>]: each step's logits with
               suppress_tokens at -inf (and begin_suppress_tokens at the first step), argmax,
               until <|endoftext|> or max_new_tokens (half the decoder's positions)
      segment: the window's span, text, tokens, average log-probability (over the tokens
               and the end token, as openai/whisper divides: sum / (n + 1)), no-speech
               probability (of <|nocaptions|> after sot), compression ratio (zlib)

What it does not do yet: timestamps (so each window is one segment and the next starts 30 s
later, openai's without_timestamps mode), beam search, temperature fallback, conditioning
on the previous window's text, an initial prompt, voice-activity filtering.

The header's "whisper" entry (converter/whisper_meta.py) gives the front end's parameters
and every special token; it is checked here (FormatError) before any window runs.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from . import arguments
from .audio import load_audio, log_mel
from .audio.mel import pad_frames
from .errors import ArgumentError, FormatError, ModelKindError

TASKS = ("transcribe", "translate")


@dataclass
class Segment:
    """One decoded window: times in seconds, text, and openai/whisper's quality figures."""

    id: int
    seek: int  # the window's first frame
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float = 0.0


@dataclass
class TranscriptionInfo:
    language: str | None
    language_probability: float
    duration: float  # seconds of audio
    all_language_probs: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WhisperMeta:
    """The header's "whisper" entry, checked."""

    n_mels: int
    sampling_rate: int
    n_fft: int
    hop_length: int
    chunk_length: int
    tokens: dict
    languages: dict
    suppress: np.ndarray
    begin_suppress: np.ndarray

    @classmethod
    def of(cls, packed, vocab: int) -> WhisperMeta:
        where = f"{packed.path}: header field 'whisper'"
        w = packed.header.get("whisper")
        if not isinstance(w, dict):
            raise FormatError(f"{where} is missing: not a Whisper file (convert it again)")

        def ids(value, what):
            ok = isinstance(value, list) and all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in value)
            if not ok:
                raise FormatError(f"{where}: {what} must be token ids below {vocab}")
            return np.array(value, np.int64)

        nums = {}
        for k in ("n_mels", "sampling_rate", "n_fft", "hop_length", "chunk_length"):
            v = w.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 20:
                raise FormatError(f"{where}: {k} is {v!r}")
            nums[k] = v
        tokens, langs = w.get("tokens"), w.get("languages")
        if not isinstance(tokens, dict) or not isinstance(langs, dict):
            raise FormatError(f"{where}: tokens and languages must be objects")
        need = ("sot", "eot", "no_timestamps", "no_speech", "transcribe", "translate")
        ids([tokens.get(k) for k in need], "tokens")
        ids(list(langs.values()), "languages")
        return cls(**nums, tokens=dict(tokens), languages=dict(langs),
                   suppress=ids(w.get("suppress_tokens", []), "suppress_tokens"),
                   begin_suppress=ids(w.get("begin_suppress_tokens", []),
                                      "begin_suppress_tokens"))


def compression_ratio(text: str) -> float:
    """len(bytes) / len(zlib-compressed bytes), openai/whisper's repetition measure."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


class Transcriber:
    """One model's decoding: the checked header, the prompt, greedy windows."""

    def __init__(self, llm):
        from .arch.whisper import Whisper

        self.llm, self.model = llm, llm._model()
        if not isinstance(self.model, Whisper):
            raise ModelKindError(f"{llm.packed.path}: {llm.packed.architecture} is not a speech "
                                 "model: transcribe() needs a Whisper model")
        self.meta = WhisperMeta.of(llm.packed, self.model.args.vocab_size)
        if self.meta.n_mels != self.model.n_mels:
            raise FormatError(f"{llm.packed.path}: the front end's {self.meta.n_mels} mel bins "
                              f"do not match the encoder's {self.model.n_mels}")
        self.frames = 2 * self.model.P  # log-mel frames per window

    def check(self, language, task: str, max_new_tokens) -> tuple[str | None, int]:
        m = self.meta
        arguments.choice(task, "task", TASKS)
        if language is not None:
            if not isinstance(language, str) or (language not in m.languages and not (
                    not m.languages and language == "en")):
                known = ", ".join(sorted(m.languages)) or "en"
                raise ArgumentError(f"language must be one of the model's ({known}), got "
                                    f"{language!r:.40}")
        if task == "translate" and not m.languages:
            raise ArgumentError("this model is English-only: it cannot translate")
        limit = self.model.context // 2
        n = arguments.integer(max_new_tokens, "max_new_tokens", 1, limit, none=True)
        return language, limit if n is None else n

    def mel(self, audio) -> tuple[np.ndarray, float]:
        m = self.meta
        samples = load_audio(audio, m.sampling_rate)
        return (log_mel(samples, m.n_mels, m.hop_length, m.sampling_rate, m.n_fft,
                        m.hop_length), samples.size / m.sampling_rate)

    def window(self, mel: np.ndarray, seek: int):
        """The cross keys/values of the window starting at frame `seek`."""
        return self.model.cross(self.model.encode(pad_frames(mel[:, seek:], self.frames)))

    def detect_language(self, cross) -> tuple[str | None, float, dict]:
        """(code, probability, all probabilities) from the first step's logits."""
        m = self.meta
        if not m.languages:
            return "en", 1.0, {"en": 1.0}
        logits = self.model.decode([m.tokens["sot"]], self.model.new_cache(cross))[0]
        codes = list(m.languages)
        x = logits[[m.languages[c] for c in codes]].astype(np.float64)
        p = np.exp(x - x.max())
        p /= p.sum()
        best = int(np.argmax(p))
        return codes[best], float(p[best]), dict(zip(codes, map(float, p), strict=True))

    def prompt(self, language: str | None, task: str) -> list[int]:
        t = self.meta.tokens
        if not self.meta.languages:  # English-only: no language or task tokens
            return [t["sot"], t["no_timestamps"]]
        return [t["sot"], self.meta.languages[language], t[task], t["no_timestamps"]]

    def greedy(self, cross, prompt: list[int], max_new_tokens: int
               ) -> tuple[list[int], float, float]:
        """(tokens without the end token, sum of their and its log-probabilities,
        no-speech probability)."""
        m, model = self.meta, self.model
        eot, cache = m.tokens["eot"], model.new_cache(cross)
        logits = model.decode(prompt, cache, last_only=False)
        no_speech = float(_softmax(logits[0])[m.tokens["no_speech"]])
        row, tokens, total = logits[-1], [], 0.0
        room = model.context - len(prompt)
        while True:
            row = row.astype(np.float64)
            row[m.suppress] = -np.inf
            if not tokens:
                row[m.begin_suppress] = -np.inf
            tok = int(np.argmax(row))
            total += float(row[tok] - _logsumexp(row))
            if tok == eot:
                break
            tokens.append(tok)
            if len(tokens) >= min(max_new_tokens, room):
                break
            row = model.decode([tok], cache)[0]
        return tokens, total, no_speech

    def segments(self, mel: np.ndarray, duration: float, first_cross, language, task: str,
                 max_new_tokens: int) -> Iterator[Segment]:
        m, n_frames = self.meta, mel.shape[1]
        seconds_per_frame = m.hop_length / m.sampling_rate
        prompt = self.prompt(language, task)
        seek, i, cross = 0, 0, first_cross
        tokenizer = self.llm.tokenizer if self.llm.packed.has_tokenizer else None
        # the front end's extra hop of padding gives one frame past the audio: not a window
        last = max(1, int(round(duration / seconds_per_frame)))
        while seek < last:
            if cross is None:
                cross = self.window(mel, seek)
            tokens, total, no_speech = self.greedy(cross, prompt, max_new_tokens)
            text = tokenizer.decode([t for t in tokens if t < m.tokens["eot"]]) \
                if tokenizer is not None else ""
            span = min(self.frames, n_frames - seek)
            yield Segment(i, seek, seek * seconds_per_frame,
                          min(duration, (seek + span) * seconds_per_frame), text, tokens,
                          total / (len(tokens) + 1), compression_ratio(text), no_speech)
            seek, i, cross = seek + self.frames, i + 1, None


def _logsumexp(x: np.ndarray) -> float:
    top = x.max()
    return float(top + np.log(np.exp(x - top).sum()))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def transcribe(llm, audio, language: str | None = None, task: str = "transcribe",
               max_new_tokens: int | None = None, blocking: bool = True,
               timeout: float | None = None):
    """(segments: a Stream of Segment, holding the model until it ends; TranscriptionInfo).
    The first window is encoded (and its language detected) before this returns."""
    t = Transcriber(llm)
    language, max_new_tokens = t.check(language, task, max_new_tokens)
    mel, duration = t.mel(audio)

    def run():  # the info first, then the segments: every step under the model's lock
        cross, probs, prob, lang = t.window(mel, 0), {}, 1.0, language
        if lang is None:
            lang, prob, probs = t.detect_language(cross)
        yield TranscriptionInfo(lang, prob, duration, probs)
        yield from t.segments(mel, duration, cross, lang, task, max_new_tokens)

    stream = llm.lifetime.stream(llm.lifetime.acquire(blocking, timeout), run())
    return stream, next(stream)
