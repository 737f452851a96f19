"""Whisper's log-mel front end, as faster-whisper (1.2) computes it, in numpy.

    x = samples (16 kHz mono float32) followed by `padding` zeros (one hop: 160)
    S = |STFT(x)|^2: n_fft 400, hop 160, periodic Hann window, centred (reflect padding
        of n_fft / 2 on both sides); the last frame dropped (openai/whisper's convention)
    M = mel_filters @ S                 80 Slaney-normalized triangles over 0-8 kHz
    L = log10(max(M, 1e-10)); L = max(L, L.max() - 8); L = (L + 4) / 4

Frames: len(x) // 160 + 1 for padding=160, one per 10 ms; the last is not content
(`window`). The clamp's maximum is taken
over the whole input, so a long file's windows are cut from one spectrogram (as
faster-whisper does), not computed window by window. A 30 s window shorter than 3,000
frames is padded with zeros *after* normalization (`pad_frames`): faster-whisper's
convention; transformers' feature extractor pads the audio with silence before the STFT
instead, which gives different values (and sometimes different transcripts) there.
The arithmetic follows faster-whisper's types (float32 window and frames, numpy's float32
FFT, complex64 spectrum, float32 filters) so that the two agree to float32 rounding.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 80
CHUNK_SECONDS = 30


def mel_filters(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """float32 [n_mels, n_fft // 2 + 1]: librosa's Slaney mel filter bank (htk=False,
    norm="slaney") from 0 Hz to sr / 2, as faster-whisper builds it."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    # mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    max_mel = min_log_mel + np.log(sr / 2 / min_log_hz) / logstep
    mels = np.linspace(0.0, max_mel, n_mels + 2)
    freqs = f_sp * mels
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    fdiff = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fftfreqs.reshape(1, -1)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (freqs[2:n_mels + 2] - freqs[:n_mels]))[:, None]  # Slaney: equal area
    return weights.astype(np.float32)


_FILTERS: dict[tuple[int, int, int], np.ndarray] = {}


def log_mel(samples: np.ndarray, n_mels: int = N_MELS, padding: int = HOP,
            sr: int = SAMPLE_RATE, n_fft: int = N_FFT, hop: int = HOP) -> np.ndarray:
    """float32 [n_mels, frames]: the normalized log-mel spectrogram of mono `samples`."""
    x = np.asarray(samples, np.float32).reshape(-1)
    if padding:
        x = np.pad(x, (0, padding))
    if x.size < n_fft // 2 + 1:  # reflect padding needs more samples than half a frame
        x = np.pad(x, (0, n_fft // 2 + 1 - x.size))
    key = (sr, n_fft, n_mels)
    if key not in _FILTERS:
        _FILTERS[key] = mel_filters(sr, n_fft, n_mels)
    window = np.hanning(n_fft + 1)[:-1].astype(np.float32)  # periodic Hann
    xp = np.pad(x, (n_fft // 2, n_fft // 2), mode="reflect")
    n_frames = 1 + (xp.size - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(xp, (n_frames, n_fft), (hop * 4, 4))
    spectrum = np.fft.rfft(frames * window, n=n_fft, axis=-1).astype(np.complex64)
    power = np.abs(spectrum[:-1].T) ** 2  # [freqs, frames - 1]: the last frame dropped
    mel = _FILTERS[key] @ power
    log_spec = np.log10(np.clip(mel, 1e-10, None))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def window(mel: np.ndarray, seek: int = 0, frames: int = 3000) -> np.ndarray:
    """The model's input window at frame `seek` of log_mel's output: at most `frames` of
    the content frames (all but the last, which only the hop of padding added), padded with
    zeros to [n_mels, frames], as faster-whisper cuts its segments."""
    content = mel.shape[1] - 1
    return pad_frames(mel[:, seek:seek + max(0, min(frames, content - seek))], frames)


def pad_frames(mel: np.ndarray, frames: int) -> np.ndarray:
    """mel [n_mels, n] cut or padded with zeros to [n_mels, frames] (faster-whisper's
    pad_or_trim of a window)."""
    n = mel.shape[1]
    if n >= frames:
        return np.ascontiguousarray(mel[:, :frames])
    return np.pad(mel, ((0, 0), (0, frames - n)))
