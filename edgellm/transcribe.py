"""Speech to text with a Whisper model: `LLM.transcribe(audio)` -> (segments, info).

    samples = load_audio(audio)                   a file (WAV; others through PyAV), WAV
                                                  bytes or a float32 array, 16 kHz
    vad: samples = the speech chunks end to end (audio/vad.py), times mapped back at the end
    mel = log_mel(samples)                        the whole input (audio/mel.py)
    language = argmax over the language tokens after <|startoftranscript|>, on the first
               window (if not given)
    per window (3,000 frames at `seek`, padded with zeros after normalization):
      enc = encode(window); cross keys/values once, shared by every beam or sample
      prompt = [<|startofprev|> previous text] sot language task [<|notimestamps|>]
      for each temperature in turn (0, 0.2, ... 1):
        tokens = at 0: beam search (beam_size 5; 1: greedy), above: the best of best_of
                 samples (transcribe_search.py); each step's logits with
                 begin_suppress_tokens (first step), suppress_tokens and the timestamp rules
                 at -inf, until <|endoftext|>, max_new_tokens or the decoder's last
                 position (faster-whisper's max_length 448; openai's stops at 224)
        done unless the compression ratio is over 2.4 or the average log-probability under
        -1 (silence excepted: no-speech probability over 0.6 with that low a probability)
      silence: no-speech probability over no_speech_threshold (0.6) while the average
               log-probability is under log_prob_threshold (-1): the window is skipped
      segments = the tokens split at pairs of timestamps; the next window starts at the
               last complete segment's end (or after this window); segments that are
               empty, of zero length or past the audio's end are dropped
      the next window's prompt: the text so far, unless the window was decoded above 0.5
      word_timestamps: the words of the window's segments timed (word_timing.py)
    each segment: start, end, text, tokens, and its window's average log-probability (over
    the tokens and the end token: sum / (n + 1)), compression ratio (zlib), no-speech
    probability (of <|nocaptions|> after sot) and temperature

This follows openai/whisper's transcribe (faster-whisper's generate_segments, with
faster-whisper's defaults: beam 5, best of 5). When every temperature fails, the last
result is kept (openai/whisper's choice; faster-whisper keeps the best-scoring one). With
word_timestamps, each window's words are timed by its alignment heads' cross-attention
(word_timing.py) and the next window starts after the last word, as openai's does. Not
done: a prefix, hotwords, hallucination_silence_threshold.

The header's "whisper" entry (converter/whisper_meta.py) gives the front end's parameters
and every special token; it is checked here (FormatError) before any window runs."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from . import arguments
from .audio import load_audio, log_mel
from .audio.mel import window
from .audio.vad import SpeechAudio, speech_chunks
from .errors import ArgumentError, FormatError, ModelKindError
from .kernels.whisper_decode import logit_rules
from .transcribe_search import beam_search, sample
from .word_timing import Word, assign, find_alignment

TASKS = ("transcribe", "translate")
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


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
    words: list[Word] | None = None  # with word_timestamps: each word's start, end, text


@dataclass
class TranscriptionInfo:
    language: str | None
    language_probability: float
    duration: float  # seconds of audio
    all_language_probs: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    """How each window is decoded (openai/whisper's transcribe options; faster-whisper's
    defaults: beam 5, best of 5 when sampling)."""

    beam_size: int = 5
    best_of: int = 5
    patience: float = 1.0
    length_penalty: float | None = None  # None: the sum over the length
    temperatures: tuple[float, ...] = TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    prompt_reset_on_temperature: float = 0.5


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
    max_initial: int  # the first timestamp's highest index (50: 1 s)
    alignment_heads: tuple = ()  # (decoder layer, head) pairs that follow the audio in time

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
        need = ("sot", "eot", "no_timestamps", "no_speech", "transcribe", "translate",
                "sot_prev", "timestamp_begin")
        ids([tokens.get(k) for k in need], "tokens")
        ids(list(langs.values()), "languages")
        return cls(**nums, tokens=dict(tokens), languages=dict(langs),
                   suppress=ids(w.get("suppress_tokens", []), "suppress_tokens"),
                   begin_suppress=ids(w.get("begin_suppress_tokens", []),
                                      "begin_suppress_tokens"),
                   max_initial=int(w.get("max_initial_timestamp_index", 50)),
                   alignment_heads=_pairs(w.get("alignment_heads", []), where))


def _pairs(value, where: str) -> tuple:
    ok = isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 16 for i in p)
        for p in value)
    if not ok:
        raise FormatError(f"{where}: alignment_heads must be [layer, head] pairs")
    return tuple(tuple(p) for p in value)


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
        self._beams = None  # the last window's beam cache: its arrays serve the next one
        layers, H = len(self.model.decoder), self.model.H
        if any(a >= layers or b >= H for a, b in self.meta.alignment_heads):
            raise FormatError(f"{llm.packed.path}: an alignment head is outside the decoder's "
                              f"{layers} layers of {H} heads")
        if not self.meta.alignment_heads:  # openai's default: every head of the top half
            self.meta = replace(self.meta, alignment_heads=tuple(
                (a, b) for a in range(layers // 2, layers) for b in range(H)))

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
        # default: as many as the decoder's positions leave after the prompt, as
        # faster-whisper's max_length (448 with the prompt) gives; openai's sample_len is 224
        limit = self.model.context
        n = arguments.integer(max_new_tokens, "max_new_tokens", 1, limit, none=True)
        return language, limit if n is None else n

    def initial_tokens(self, prompt) -> list[int]:
        """An initial prompt as token ids: text (encoded as " " + text, as faster-whisper
        does) or ids already."""
        if prompt is None:
            return []
        if isinstance(prompt, str):
            return self.llm.tokenizer.encode(" " + prompt.strip())
        return arguments.token_ids(prompt, self.meta.tokens["eot"], "initial_prompt")

    def mel(self, audio, vad: bool = False) -> tuple[np.ndarray, float, SpeechAudio | None]:
        """(log-mel, seconds of audio, the speech found by the VAD or None): with vad, the
        log-mel is of the speech alone, end to end (the whole audio if none is found:
        its first window then only serves language detection)."""
        m = self.meta
        samples = load_audio(audio, m.sampling_rate)
        speech = SpeechAudio(samples, speech_chunks(samples), m.sampling_rate) if vad else None
        x = speech.audio if speech is not None and speech.chunks else samples
        return (log_mel(x, m.n_mels, m.hop_length, m.sampling_rate, m.n_fft, m.hop_length),
                samples.size / m.sampling_rate, speech)

    def window(self, mel: np.ndarray, seek: int):
        """The cross keys/values of the window starting at frame `seek`."""
        return self.model.cross(self.model.encode(window(mel, seek, self.frames)))

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

    def prompt(self, language: str | None, task: str, timestamps: bool,
               previous: list[int]) -> list[int]:
        """[<|startofprev|> previous...] sot [language task] [<|notimestamps|>]: the
        previous text at most half the decoder's positions (openai/whisper's get_prompt)."""
        t = self.meta.tokens
        out = [t["sot_prev"], *previous[-(self.model.context // 2 - 1):]] if previous else []
        out.append(t["sot"])
        if self.meta.languages:  # English-only models have no language or task tokens
            out += [self.meta.languages[language], t[task]]
        return out if timestamps else [*out, t["no_timestamps"]]

    def timestamp_rules(self, row: np.ndarray, tokens: list[int]) -> None:
        """openai/whisper's ApplyTimestampRules (= transformers' WhisperTimeStamp-
        LogitsProcessor) on the logits `row` after the generated `tokens`, in place."""
        t = self.meta.tokens
        begin, eot = t["timestamp_begin"], t["eot"]
        row[t["no_timestamps"]] = -np.inf
        last = len(tokens) >= 1 and tokens[-1] >= begin
        penultimate = len(tokens) < 2 or tokens[-2] >= begin
        if last:  # timestamps come in pairs, except right before the end
            if penultimate:
                row[begin:] = -np.inf
            else:
                row[:eot] = -np.inf
        stamps = [x for x in tokens if x >= begin]
        if stamps:  # never decreasing, and a segment never of zero length
            row[begin:stamps[-1] if last and not penultimate else stamps[-1] + 1] = -np.inf
        if not tokens:  # a window starts with a timestamp, within the first second
            row[:begin] = -np.inf
            row[begin + self.meta.max_initial + 1:] = -np.inf
        logp = row - _logsumexp(row)
        if _logsumexp(logp[begin:]) > logp[:begin].max():  # timestamps more likely: take one
            row[:begin] = -np.inf

    def filters(self, row: np.ndarray, tokens: list[int], timestamps: bool) -> None:
        """openai/whisper's logit filters on a float64 logits row after the generated
        `tokens`, in place: suppress at the beginning, suppress, the timestamp rules
        (sampling's; greedy and beam search run them as one kernel: rules())."""
        if not tokens:
            row[self.meta.begin_suppress] = -np.inf
        row[self.meta.suppress] = -np.inf
        if timestamps:
            self.timestamp_rules(row, tokens)

    def rules(self, rows: np.ndarray, history: np.ndarray, k: int, timestamps: bool
              ) -> tuple[np.ndarray, np.ndarray]:
        """filters() on float32 logits rows [B, V] in place after each row's `history`
        [B, n], then each row's k most likely tokens [B, k] and their log-probabilities
        (kernels/whisper_decode.py: one pass of compiled code over the vocabulary)."""
        t = self.meta.tokens
        rules = np.array([int(timestamps), t["no_timestamps"], t["timestamp_begin"], t["eot"],
                          self.meta.max_initial], np.int64)
        return logit_rules(rows, history, k, rules, self.meta.suppress,
                           self.meta.begin_suppress)

    def greedy(self, cross, prompt: list[int], max_new_tokens: int, timestamps: bool
               ) -> tuple[list[int], float, float]:
        """(tokens without the end token, sum of their and its log-probabilities,
        no-speech probability)."""
        m, model = self.meta, self.model
        eot, cache = m.tokens["eot"], model.new_cache(cross)
        logits = model.decode(prompt, cache, rows=[prompt.index(m.tokens["sot"]), -1])
        no_speech = float(_softmax(logits[0])[m.tokens["no_speech"]])
        rows, tokens, total = logits[-1:].copy(), [], 0.0
        room = model.context - len(prompt)
        while True:
            idx, logp = self.rules(rows, np.array(tokens, np.int64)[None], 1, timestamps)
            tok = int(idx[0, 0])
            total += float(logp[0, 0])
            if tok == eot:
                break
            tokens.append(tok)
            if len(tokens) >= min(max_new_tokens, room):
                break
            rows = model.decode([tok], cache)
        return tokens, total, no_speech

    def search(self, cross, prompt: list[int], max_new_tokens: int, timestamps: bool,
               temperature: float, opts: Options, rng: np.random.Generator
               ) -> tuple[list[int], float, float]:
        """greedy()'s result by beam search (temperature 0) or the best of opts.best_of
        samples (transcribe_search.py): the prompt prefilled once, its cache copied to
        every sequence, the window's cross keys and values shared by all."""
        n = opts.beam_size if temperature == 0 else opts.best_of
        if temperature == 0 and n == 1:
            return self.greedy(cross, prompt, max_new_tokens, timestamps)
        m, model = self.meta, self.model
        one = model.new_cache(cross)
        logits = model.decode(prompt, one, rows=[prompt.index(m.tokens["sot"]), -1])
        no_speech = float(_softmax(logits[0])[m.tokens["no_speech"]])
        limit = min(max_new_tokens, model.context - len(prompt))
        # every position (the last window's arrays, whatever this one's prompt and limit)
        cache = self._beams = one.repeat(n, model.context, self._beams)

        def step(ids):
            return model.decode(np.asarray(ids, np.int64).reshape(-1, 1), cache)

        def filters(row, tokens):
            self.filters(row, tokens, timestamps)

        def rules(rows, history, k):
            return self.rules(rows, history, k, timestamps)

        eot = m.tokens["eot"]
        if temperature == 0:
            tokens, total = beam_search(logits[-1], step, cache.reorder, rules, eot, n,
                                        opts.patience, limit, opts.length_penalty)
        else:
            tokens, total = sample(logits[-1], step, filters, eot, n, temperature, limit, rng,
                                   opts.length_penalty)
        return tokens, total, no_speech

    def decode_window(self, cross, prompt: list[int], max_new_tokens: int, timestamps: bool,
                      opts: Options, rng: np.random.Generator, text_of):
        """openai/whisper's decode_with_fallback: each temperature in turn until the window's
        compression ratio and average log-probability pass their thresholds (or the window
        is silence): (tokens, sum of log-probabilities, no-speech probability, average
        log-probability, compression ratio, temperature)."""
        for t in opts.temperatures:
            tokens, total, no_speech = self.search(cross, prompt, max_new_tokens, timestamps,
                                                   t, opts, rng)
            avg = total / (len(tokens) + 1)
            ratio = compression_ratio(text_of(tokens).strip())
            retry = (opts.compression_ratio_threshold is not None and
                     ratio > opts.compression_ratio_threshold) or \
                (opts.log_prob_threshold is not None and avg < opts.log_prob_threshold)
            if opts.no_speech_threshold is not None and no_speech > opts.no_speech_threshold \
                    and opts.log_prob_threshold is not None and avg < opts.log_prob_threshold:
                retry = False  # silence: skipped, not decoded again
            if not retry:
                break
        return tokens, total, no_speech, avg, ratio, t

    def split(self, tokens: list[int], seek: int, size: int
              ) -> tuple[list[tuple[float, float, list[int]]], int]:
        """A window's tokens as (start, end, tokens) segments by their timestamp pairs, and
        the next window's first frame (faster-whisper's _split_segments_by_timestamps)."""
        begin = self.meta.tokens["timestamp_begin"]
        per_frame = self.meta.hop_length / self.meta.sampling_rate
        offset, step = seek * per_frame, 0.02  # a timestamp token is 20 ms: 2 frames
        single_ending = len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]
        pairs = [i for i in range(1, len(tokens)) if tokens[i] >= begin <= tokens[i - 1]]
        if not pairs:
            stamps = [x for x in tokens if x >= begin]
            duration = (stamps[-1] - begin) * step if stamps and stamps[-1] != begin \
                else size * per_frame
            return [(offset, offset + duration, tokens)], seek + size
        cuts = pairs + [len(tokens)] if single_ending else pairs
        out, last = [], 0
        for cut in cuts:
            part = tokens[last:cut]
            out.append((offset + (part[0] - begin) * step, offset + (part[-1] - begin) * step,
                        part))
            last = cut
        if single_ending:  # nothing said after the last timestamp: the whole window is done
            return out, seek + size
        return out, seek + (tokens[last - 1] - begin) * 2  # from the last complete segment

    def add_words(self, found: list[Segment], cross, language, task: str, seek: int,
                  size: int, last_speech: float, text_of) -> float:
        """Word timestamps for a window's segments (word_timing.py): one decoder pass over
        sot language task <|notimestamps|> text <|endoftext|>, keeping the alignment heads'
        cross-attention; sets each segment's `words`, returns the last speech's end."""
        m = self.meta
        eot = m.tokens["eot"]
        text = [t for f in found for t in f.tokens if t < eot]
        for f in found:
            f.words = []
        if not text or self.llm.packed.has_tokenizer is False:
            return last_speech
        sot_seq = self.prompt(language, task, False, [])[:-1]
        ids = [*sot_seq, m.tokens["no_timestamps"], *text, eot]
        if len(ids) > self.model.context:
            return last_speech
        scores: list[np.ndarray] = []
        logits = self.model.decode(ids, self.model.new_cache(cross), last_only=False,
                                   cross_scores=scores)
        words = find_alignment(scores, self.meta.alignment_heads, logits, text, len(sot_seq),
                               size, eot, text_of, language)
        offset = seek * self.meta.hop_length / self.meta.sampling_rate
        return assign(found, words, offset, last_speech, eot)

    def segments(self, mel: np.ndarray, duration: float, first_cross, language, task: str,
                 max_new_tokens: int, timestamps: bool, condition: bool,
                 initial: list[int], opts: Options | None = None,
                 rng: np.random.Generator | None = None, progress=None,
                 words: bool = False) -> Iterator[Segment]:
        m, opts = self.meta, opts or Options()
        last_speech = 0.0
        rng = rng if rng is not None else np.random.default_rng(0)
        per_frame = m.hop_length / m.sampling_rate
        content = mel.shape[1] - 1  # the last frame comes from the hop of padding
        seek, i, cross, history = 0, 0, first_cross, list(initial)
        tokenizer = self.llm.tokenizer if self.llm.packed.has_tokenizer else None
        text_of = (lambda ids: tokenizer.decode([x for x in ids if x < m.tokens["eot"]])) \
            if tokenizer is not None else (lambda ids: "")
        while seek < content:
            size = min(self.frames, content - seek)
            if cross is None:
                cross = self.window(mel, seek)
            prompt = self.prompt(language, task, timestamps, history)
            tokens, _, no_speech, avg, ratio, temperature = self.decode_window(
                cross, prompt, max_new_tokens, timestamps, opts, rng, text_of)
            if timestamps:
                parts, next_seek = self.split(tokens, seek, size)
            else:
                parts, next_seek = [(seek * per_frame, (seek + size) * per_frame, tokens)], \
                    seek + size
            if opts.no_speech_threshold is not None and no_speech > opts.no_speech_threshold \
                    and not (opts.log_prob_threshold is not None and
                             avg > opts.log_prob_threshold):
                seek, cross = seek + size, None  # silence: nothing said in this window
                if progress is not None:
                    progress(min(seek * per_frame, duration), duration)
                continue
            found = [Segment(0, seek, start, end, text_of(part), part, avg, ratio, no_speech,
                             temperature) for start, end, part in parts]
            if words:
                last_speech = self.add_words(found, cross, language, task, seek, size,
                                             last_speech, text_of)
                single_ending = len(tokens) >= 2 and tokens[-2] < m.tokens["timestamp_begin"] \
                    <= tokens[-1]
                ends = [w.end for f in found for w in f.words]
                if timestamps and not single_ending and ends and ends[-1] > seek * per_frame:
                    next_seek = round(ends[-1] / per_frame)  # after the last word (openai's)
            for seg in found:
                if seg.start == seg.end or (tokenizer is not None and not seg.text.strip()):
                    continue  # instantaneous or empty: as faster-whisper, not a segment
                if seg.start >= duration:  # timestamps past the audio's end: not a segment
                    continue
                history += seg.tokens
                seg.id, seg.end = i, min(seg.end, duration)
                yield seg
                i += 1
            if not condition or temperature > opts.prompt_reset_on_temperature:
                history = []  # a window sampled hot is no context for the next one
            # a window whose only complete segment ends at 0.00 ([<|0.00|><|0.00|>, ...])
            # would be decoded again forever: go on after it instead
            seek, cross = (next_seek if next_seek > seek else seek + size), None
            if progress is not None:
                progress(min(seek * per_frame, duration), duration)
        if progress is not None:  # the hop of padding after the content frames: all done
            progress(duration, duration)


def _threshold(value, name: str, lo: float, hi: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ArgumentError(f"{name} must be a number in [{lo:g}, {hi:g}] or None, got "
                            f"{value!r:.40}")
    return float(value)


def _logsumexp(x: np.ndarray) -> float:
    top = x.max()
    if top == -np.inf:  # everything suppressed (the timestamps, by the rules)
        return -np.inf
    return float(top + np.log(np.exp(x - top).sum()))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def _temperatures(value) -> tuple[float, ...]:
    one = not isinstance(value, (list, tuple))
    values = [value] if one else list(value)
    ok = values and all(not isinstance(v, bool) and isinstance(v, (int, float)) and
                        0 <= v <= 2 for v in values)
    if not ok:
        raise ArgumentError(f"temperature must be a number in [0, 2] or a non-empty sequence "
                            f"of them (tried in turn), got {value!r:.60}")
    return tuple(float(v) for v in values)


def options(beam_size=5, best_of=5, patience=1.0, length_penalty=None,
            temperature=TEMPERATURES, compression_ratio_threshold=2.4,
            log_prob_threshold=-1.0, no_speech_threshold=0.6) -> Options:
    """The decoding options, checked (ArgumentError naming the bad one)."""
    return Options(
        beam_size=arguments.integer(beam_size, "beam_size", 1, 64),
        best_of=arguments.integer(best_of, "best_of", 1, 64),
        patience=_threshold(patience, "patience", 1e-3, 64.0) or 1.0,
        length_penalty=_threshold(length_penalty, "length_penalty", 0.0, 10.0),
        temperatures=_temperatures(temperature),
        compression_ratio_threshold=_threshold(compression_ratio_threshold,
                                               "compression_ratio_threshold", 0.0, 1e9),
        log_prob_threshold=_threshold(log_prob_threshold, "log_prob_threshold", -1e9, 0.0),
        no_speech_threshold=_threshold(no_speech_threshold, "no_speech_threshold", 0.0, 1.0))


def transcribe(llm, audio, language: str | None = None, task: str = "transcribe", *,
               beam_size: int = 5, best_of: int = 5, patience: float = 1.0,
               length_penalty: float | None = None, temperature=TEMPERATURES,
               compression_ratio_threshold: float | None = 2.4,
               log_prob_threshold: float | None = -1.0,
               no_speech_threshold: float | None = 0.6, seed: int | None = 0,
               without_timestamps: bool = False, condition_on_previous_text: bool = True,
               initial_prompt=None, max_new_tokens: int | None = None,
               vad: bool = False, word_timestamps: bool = False, progress=None,
               blocking: bool = True, timeout: float | None = None):
    """(segments: a Stream of Segment, holding the model until it ends; TranscriptionInfo).
    The first window is encoded (and its language detected) before this returns."""
    t = Transcriber(llm)
    language, max_new_tokens = t.check(language, task, max_new_tokens)
    opts = options(beam_size, best_of, patience, length_penalty, temperature,
                   compression_ratio_threshold, log_prob_threshold, no_speech_threshold)
    seed = arguments.integer(seed, "seed", 0, None, none=True)
    timestamps = not arguments.flag(without_timestamps, "without_timestamps")
    condition = arguments.flag(condition_on_previous_text, "condition_on_previous_text")
    initial = t.initial_tokens(initial_prompt)
    vad = arguments.flag(vad, "vad")
    words = arguments.flag(word_timestamps, "word_timestamps")
    if progress is not None and not callable(progress):
        raise ArgumentError("progress must be a callable (seconds done, seconds in all)")
    mel, duration, speech = t.mel(audio, vad)

    def run():  # the info first, then the segments: every step under the model's lock
        cross, probs, prob, lang = t.window(mel, 0), {}, 1.0, language
        if lang is None:
            lang, prob, probs = t.detect_language(cross)
        yield TranscriptionInfo(lang, prob, duration, probs)
        if speech is None:
            yield from t.segments(mel, duration, cross, lang, task, max_new_tokens, timestamps,
                                  condition, initial, opts, np.random.default_rng(seed),
                                  progress, words)
            return
        if not speech.chunks:  # nothing but silence: nothing to decode
            if progress is not None:
                progress(duration, duration)
            return
        heard = speech.audio.size / speech.rate

        def done(at, _):  # progress in the recording's time
            progress(min(speech.original(at, end=True), duration), duration)

        for s in t.segments(mel, heard, cross, lang, task, max_new_tokens, timestamps,
                            condition, initial, opts, np.random.default_rng(seed),
                            done if progress is not None else None, words):
            s.start, s.end = speech.original(s.start), speech.original(s.end, end=True)
            for w in s.words or ():
                w.start, w.end = speech.original(w.start), speech.original(w.end, end=True)
            yield s
        if progress is not None:
            progress(duration, duration)

    stream = llm.lifetime.stream(llm.lifetime.acquire(blocking, timeout), run())
    return stream, next(stream)
