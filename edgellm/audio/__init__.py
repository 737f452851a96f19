"""Audio input for speech models: WAV reading, resampling, Whisper's log-mel front end.

    read_wav(path or bytes) -> (float32 samples [n, channels] in [-1, 1], sample rate)
    load_audio(audio, rate=16000) -> float32 mono [n] at `rate` (a path, WAV bytes, or an array)
    resample(x, from_rate, to_rate) -> float32 [m]       (windowed-sinc, numpy only)
    log_mel(samples, ...) -> float32 [n_mels, frames]    (faster-whisper's front end)
"""

from __future__ import annotations

from .load import load_audio
from .mel import log_mel, mel_filters
from .resample import resample
from .wav import read_wav

__all__ = ["load_audio", "log_mel", "mel_filters", "read_wav", "resample"]
