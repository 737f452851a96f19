"""Voice-activity detection by frame energy against the recording's own noise floor, and the
speech-only audio Whisper decodes with vad=True (faster-whisper's collect_chunks and
SpeechTimestampsMap, with this detector in place of its Silero model).

    speech_chunks(samples [n] at 16 kHz) -> [(start, end) in samples]
        energy of 30 ms frames (10 ms hop) in dB; floor = the 10th percentile of the
        frames' energies; a frame is speech when its energy is over
        max(floor + MARGIN_DB, SILENCE_DB); speech runs shorter than MIN_SPEECH are
        dropped, gaps shorter than MIN_SILENCE merged (faster-whisper's 2 s), each chunk
        padded by PAD (its 400 ms)
    SpeechAudio(samples, chunks): .audio (the chunks end to end), .original(t) (a time in
        it -> the time in the recording)

Chosen over Silero VAD (an ONNX model: onnxruntime would be a new dependency) after
measuring both on synthesized speech with silence, white noise under the speech, pure
silence and pure noise (scripts/measure-vad.py, docs/speech.md): the same speech kept and
the same silence dropped there. What it cannot do that a model can: tell speech from loud
non-speech sound (music, a slammed door): that passes as speech and is left to Whisper's
own no-speech check.
"""

from __future__ import annotations

import numpy as np

RATE = 16000
FRAME, HOP = 480, 160  # 30 ms frames every 10 ms
MARGIN_DB = 12.0  # speech stands this far over the noise floor
SILENCE_DB = -55.0  # below this (dB full scale) nothing is speech, whatever the floor
MIN_SPEECH = int(0.25 * RATE)
MIN_SILENCE = 2 * RATE
PAD = int(0.4 * RATE)


def frame_energy(x: np.ndarray) -> np.ndarray:
    """dB full scale of each 30 ms frame, every 10 ms: float64 [frames]."""
    if x.size < FRAME:
        x = np.pad(x, (0, FRAME - x.size))
    n = 1 + (x.size - FRAME) // HOP
    frames = np.lib.stride_tricks.as_strided(x, (n, FRAME), (HOP * x.itemsize, x.itemsize))
    power = (frames.astype(np.float64) ** 2).mean(axis=1)
    return 10 * np.log10(power + 1e-12)


def speech_chunks(x: np.ndarray) -> list[tuple[int, int]]:
    """The speech of mono 16 kHz samples as [(start, end)] sample ranges, in order."""
    x = np.asarray(x, np.float32).reshape(-1)
    if x.size == 0:
        return []
    db = frame_energy(x)
    threshold = max(float(np.percentile(db, 10)) + MARGIN_DB, SILENCE_DB)
    active = db > threshold
    runs, start = [], None
    for i, on in enumerate(active):  # frame i covers samples [i HOP, i HOP + FRAME)
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append([start * HOP, (i - 1) * HOP + FRAME])
            start = None
    if start is not None:
        runs.append([start * HOP, min(x.size, (len(active) - 1) * HOP + FRAME)])
    merged: list[list[int]] = []
    for r in runs:
        if merged and r[0] - merged[-1][1] < MIN_SILENCE:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    out = []
    for s, e in merged:
        if e - s >= MIN_SPEECH:
            s, e = max(0, s - PAD), min(x.size, e + PAD)
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
    return out


class SpeechAudio:
    """The speech chunks of a recording end to end, and the way back to its times."""

    def __init__(self, x: np.ndarray, chunks: list[tuple[int, int]], rate: int = RATE):
        self.rate, self.chunks = rate, chunks
        self.audio = np.concatenate([x[s:e] for s, e in chunks]) if chunks else \
            np.zeros(0, np.float32)
        self.offsets = np.cumsum([0] + [e - s for s, e in chunks])  # chunk starts in .audio

    def original(self, t: float, end: bool = False) -> float:
        """A time (seconds) in .audio -> the recording's: within the chunk holding it (the
        earlier chunk at a boundary when `end`)."""
        if not self.chunks:
            return t
        pos = t * self.rate
        i = int(np.searchsorted(self.offsets[1:], pos, side="left" if end else "right"))
        i = min(i, len(self.chunks) - 1)
        return float((self.chunks[i][0] + pos - self.offsets[i]) / self.rate)
