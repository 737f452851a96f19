"""Any accepted audio input -> float32 mono samples at the model's rate.

Accepted: a WAV path or its bytes (wav.py), other audio files or bytes (mp3, m4a, ogg,
flac, webm, ...) with the `audio` extra (decode.py: PyAV), or a float array of samples
already at the model's rate ([n], or [n, channels]). Channels are averaged (as ffmpeg's
downmix and faster-whisper's decode do); other rates are resampled (resample.py).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import AudioError
from .decode import available, decode_audio
from .resample import resample
from .wav import read_wav

OTHER_FORMATS = (".mp3", ".m4a", ".ogg", ".flac", ".webm", ".opus", ".aac", ".mp4")


def load_audio(audio, rate: int = 16000) -> np.ndarray:
    """float32 mono samples [n] at `rate` of a WAV path / bytes or a float array."""
    if isinstance(audio, np.ndarray):
        return _array(audio)
    if isinstance(audio, (bytes, bytearray, memoryview)):
        if bytes(audio[:4]) not in (b"RIFF", b"RIFX") and available():
            return decode_audio(audio, rate, "audio")  # not WAV: FFmpeg may know it
        x, src_rate = read_wav(audio)
    elif isinstance(audio, (str, os.PathLike)):
        path = os.fspath(audio)
        if not os.path.exists(path):
            raise AudioError(f"{path}: no such file")
        if path.lower().endswith(OTHER_FORMATS) or (not _is_wav(path) and available()):
            return decode_audio(path, rate, path)
        x, src_rate = read_wav(path)
    else:
        raise AudioError(f"audio must be a file path, audio bytes or a float32 array, got "
                         f"{type(audio).__name__}")
    mono = x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0]
    return resample(mono, src_rate, rate) if src_rate != rate else np.ascontiguousarray(mono)


def _is_wav(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) in (b"RIFF", b"RIFX")
    except OSError:
        return True  # read_wav says why it cannot be read


def _array(a: np.ndarray) -> np.ndarray:
    if not np.issubdtype(a.dtype, np.floating):
        raise AudioError(f"an audio array must hold floats in [-1, 1] at 16 kHz, got {a.dtype}")
    if a.ndim == 2:
        a = a.mean(axis=1)
    if a.ndim != 1:
        raise AudioError(f"an audio array must be 1-D (or [n, channels]), got {a.ndim}-D")
    if a.size == 0:
        raise AudioError("the audio array is empty")
    if not np.isfinite(a).all():
        raise AudioError("the audio array holds NaN or infinite values")
    return np.ascontiguousarray(a, dtype=np.float32)
