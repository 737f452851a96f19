"""Compressed audio (mp3, m4a, ogg, flac, webm, ...) through PyAV, the optional `audio`
extra: FFmpeg's demuxers and decoders in a wheel (what faster-whisper decodes with), which
no code of ours could match for formats and robustness.

    decode_audio(path or bytes, rate) -> float32 mono [n] at `rate`

As faster-whisper's decode_audio: the first audio stream, downmixed to mono and resampled
by FFmpeg's swresample to 16-bit samples at `rate`, scaled by 1 / 32768.
"""

from __future__ import annotations

import io

import numpy as np

from ..errors import AudioError

EXTRA = "pip install 'edgellm[audio]'"


def available() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def decode_audio(source, rate: int, where: str) -> np.ndarray:
    try:
        import av
    except ImportError:
        raise AudioError(f"{where}: compressed audio needs the audio extra (PyAV): "
                         f"{EXTRA}") from None
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    chunks = []
    try:
        with av.open(source, mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError(f"{where}: no audio stream")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):  # what the resampler still holds
                chunks.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError as e:
        raise AudioError(f"{where}: not a WAV file, nor audio FFmpeg can decode "
                         f"({e.strerror or e})") from None
    if not chunks or not sum(c.size for c in chunks):
        raise AudioError(f"{where}: no samples")
    return np.concatenate(chunks).astype(np.float32) / np.float32(32768.0)
