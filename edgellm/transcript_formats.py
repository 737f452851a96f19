"""A transcription's segments as text: the formats `edgellm transcribe` prints and the
server's /v1/audio/ routes answer with (text lines, srt, vtt, json).

    w = Writer("srt", out, plain=False); w.head(); w.segment(s) for each; w.tail(name, info)
"""

from __future__ import annotations

import json


def timestamp(seconds: float, marker: str = ".", hours: bool = True) -> str:
    """seconds -> HH:MM:SS.mmm (marker "," for srt); without hours when `hours` is False
    and they are zero (openai/whisper's format_timestamp)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    head = f"{h:02d}:" if hours or h else ""
    return f"{head}{m:02d}:{s:02d}{marker}{ms:03d}"


class Writer:
    """One file's output in one format: head(), segment() as each is decoded, tail(info)."""

    def __init__(self, fmt: str, out, plain: bool):
        self.fmt, self.out, self.plain, self.n, self.rows = fmt, out, plain, 0, []

    def head(self) -> None:
        if self.fmt == "vtt":
            self.out.write("WEBVTT\n\n")

    def segment(self, s) -> None:
        text = s.text.strip()
        if not text and self.fmt in ("srt", "vtt"):
            return  # an empty cue's blank line would end it early (only a model without
            # a tokenizer gives one: transcribe() drops empty segments)
        self.n += 1
        if self.fmt == "text":
            self.out.write(f"{text}\n" if self.plain else
                           f"[{timestamp(s.start, hours=False)} --> "
                           f"{timestamp(s.end, hours=False)}] {text}\n")
        elif self.fmt == "srt":
            self.out.write(f"{self.n}\n{timestamp(s.start, ',')} --> "
                           f"{timestamp(s.end, ',')}\n{text}\n\n")
        elif self.fmt == "vtt":
            self.out.write(f"{timestamp(s.start)} --> {timestamp(s.end)}\n{text}\n\n")
        else:
            row = {"id": s.id, "start": round(s.start, 3), "end": round(s.end, 3),
                   "text": text}
            if s.words is not None:
                row["words"] = [{"word": w.word, "start": round(w.start, 3),
                                 "end": round(w.end, 3), "probability": round(w.probability, 4)}
                                for w in s.words]
            self.rows.append(row)
        self.out.flush()

    def tail(self, name: str, info) -> None:
        if self.fmt == "json":
            self.out.write(json.dumps({
                "file": name, "language": info.language,
                "language_probability": round(info.language_probability, 4),
                "duration": round(info.duration, 3), "segments": self.rows},
                ensure_ascii=False) + "\n")
            self.out.flush()
