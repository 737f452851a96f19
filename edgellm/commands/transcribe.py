"""Transcribe speech in audio files with a Whisper model (default: whisper-base).

Segments are printed as they are decoded. --format text: `[mm:ss.xxx --> mm:ss.xxx] text`
lines (as openai/whisper's verbose output; hours shown past one hour), or the plain text
with --no-timestamps; srt and vtt: the subtitle formats; json: one object per file
{"file", "language", "language_probability", "duration", "segments": [{"id", "start",
"end", "text", and with --word-timestamps "words": [{"word", "start", "end",
"probability"}]}]}, one per line. With several files, text and json go to stdout one file
after another (text under a `==> FILE <==` line); srt and vtt need -o DIR, which writes
DIR/NAME.srt (.vtt, .txt, .json) for each input, as whisper's --output_dir does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import EdgeLLMError
from ..transcript_formats import Writer, timestamp
from .common import _threads, int_at_least, open_model, say, text_argument

TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

FORMATS = ("text", "srt", "vtt", "json")
SUFFIX = {"text": ".txt", "srt": ".srt", "vtt": ".vtt", "json": ".json"}


def add_arguments(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="audio files: WAV; mp3, m4a, ogg, flac, webm with the audio extra")
    p.add_argument("-m", "--model", default="whisper-base",
                   type=text_argument("model name or path", empty=False),
                   help="a Whisper model file or catalog name (default: whisper-base)")
    p.add_argument("-t", "--threads", type=_threads, default=None,
                   help="threads (default: all cores)")
    p.add_argument("--language", default=None, type=text_argument("language", empty=False),
                   help="the spoken language's code, e.g. en (default: detected)")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                   help="transcribe, or translate into English (default: transcribe)")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="output format (default: text)")
    p.add_argument("--no-timestamps", action="store_true",
                   help="text format: the plain text, without the segments' times")
    p.add_argument("--initial-prompt", default=None, type=text_argument("initial prompt"),
                   help="text the first window continues (names, spelling, style)")
    p.add_argument("--no-condition", dest="condition", action="store_false",
                   help="do not give each window the previous window's text")
    p.add_argument("--beam-size", type=int_at_least(1), default=5,
                   help="beams at temperature 0 (default: 5; 1: greedy)")
    p.add_argument("--best-of", type=int_at_least(1), default=5,
                   help="samples per window at temperatures above 0 (default: 5)")
    p.add_argument("--temperature", type=_temperatures, default=TEMPERATURES,
                   help="a temperature, or several separated by commas tried in turn while "
                   "a window looks wrong (default: 0,0.2,0.4,0.6,0.8,1)")
    p.add_argument("--vad", action="store_true",
                   help="skip what voice-activity detection finds silent before decoding")
    p.add_argument("--word-timestamps", action="store_true",
                   help="json: each segment's words with their start, end and probability")
    p.add_argument("--progress", action="store_true",
                   help="show progress on stderr even when it is not a terminal")
    p.add_argument("-o", "--output-dir", default=None,
                   help="write DIR/NAME.EXT for each input instead of stdout")
    p.set_defaults(ctx=None, precise=False)


def _temperatures(text: str) -> tuple[float, ...]:
    import argparse

    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(0 <= v <= 2 for v in values):
        raise argparse.ArgumentTypeError(f"must be numbers in [0, 2] separated by commas, got "
                                         f"{text!r:.40}")
    return values


class Progress:
    """A progress bar on stderr for one file: a line redrawn in place on a terminal, one
    line per update otherwise (--progress); cleared before each segment is printed, so the
    segments stay whole when stdout is the same terminal."""

    WIDTH = 30

    def __init__(self, name: str, stream, tty: bool):
        self.name, self.stream, self.tty, self.shown, self.last = name, stream, tty, False, ""

    def update(self, done: float, total: float) -> None:
        frac = 1.0 if total <= 0 else min(1.0, done / total)
        n = round(frac * self.WIDTH)
        self.last = (f"{self.name} [{'#' * n}{'.' * (self.WIDTH - n)}] {frac * 100:3.0f}% "
                     f"{timestamp(done, hours=False)}/{timestamp(total, hours=False)}")
        self.draw()

    def draw(self) -> None:
        if self.last:
            self.stream.write(f"\r\033[K{self.last}" if self.tty else f"{self.last}\n")
            self.shown = self.tty
            self.stream.flush()

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False

    def close(self) -> None:
        self.clear()
        self.last = ""


def _check(args) -> list[Path]:
    """The output paths (-o) or None each; refusals before the model loads."""
    for f in args.files:
        if not os.path.isfile(f):
            raise EdgeLLMError(f"{f}: no such file")
    if args.output_dir is None:
        if len(args.files) > 1 and args.format in ("srt", "vtt"):
            raise EdgeLLMError(f"--format {args.format} with several files needs -o DIR (one "
                               "file written for each input)")
        return [None] * len(args.files)
    out = Path(args.output_dir)
    if not out.is_dir():
        raise EdgeLLMError(f"{args.output_dir}: not a directory")
    paths = [out / (Path(f).stem + SUFFIX[args.format]) for f in args.files]
    if len(set(paths)) < len(paths):
        raise EdgeLLMError("two inputs have the same name: their outputs would overwrite "
                           "each other in " + args.output_dir)
    return paths


def run(args) -> int:
    from ..transcribe import Transcriber

    outputs = _check(args)
    with open_model(args, warm=False) as llm:
        Transcriber(llm)  # a text or embedding model is refused here, before any compiling
        from ..kernels.warmup import compile_notice, release_compiler_pages

        with compile_notice(say):
            llm.model.warmup(release_compiler_pages)
        for name, path in zip(args.files, outputs):
            if path is None:
                if len(args.files) > 1 and args.format == "text":
                    sys.stdout.write(f"==> {name} <==\n")
                _one(llm, args, name, sys.stdout)
                continue
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    _one(llm, args, name, f)
                os.replace(tmp, path)
            except OSError as e:
                raise EdgeLLMError(f"{path}: cannot write: {e.strerror or e}") from None
            finally:
                if tmp.exists():
                    tmp.unlink()
            say(f"edgellm: wrote {path}")
    return 0


def _one(llm, args, name: str, out) -> None:
    tty = sys.stderr.isatty()
    bar = Progress(name, sys.stderr, tty) if tty or args.progress else None
    segments, info = llm.transcribe(name, language=args.language, task=args.task,
                                    beam_size=args.beam_size, best_of=args.best_of,
                                    temperature=args.temperature, vad=args.vad,
                                    word_timestamps=args.word_timestamps,
                                    initial_prompt=args.initial_prompt,
                                    condition_on_previous_text=args.condition,
                                    progress=bar.update if bar else None)
    w = Writer(args.format, out, args.no_timestamps)
    w.head()
    if bar:
        bar.update(0.0, info.duration)
    try:
        for s in segments:
            if bar:
                bar.clear()
            w.segment(s)
            if bar:
                bar.draw()
    finally:
        segments.close()
        if bar:
            bar.close()
    w.tail(name, info)
