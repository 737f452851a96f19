"""Sample-rate conversion by windowed-sinc interpolation, numpy only.

    resample(x [n], from_rate, to_rate) -> float32 [ceil(n * to_rate / from_rate)]

Output sample m sits at input time t = m * from_rate / to_rate; its value is
    sum_k x[k] c sinc(c (t - k)) kaiser((t - k) / (ZEROS / c))
with the cutoff c = ROLLOFF * min(1, to_rate / from_rate) in cycles per input sample
(below the lower Nyquist frequency: no aliasing when downsampling) over ZEROS zero
crossings either side (resampy's and libsoxr's design). The ratio is rational
(to/from = L/M in lowest terms), so t's fraction takes only L values: one filter per
phase, tabulated once, each scaled to unit DC gain. Measured in tests/test_audio.py: a
1 kHz tone 44.1 kHz -> 16 kHz within 1e-3 of the exact sine, a 10 kHz one attenuated
below -60 dB. Chosen over scipy.signal.resample_poly (scipy is not a dependency) and over
linear interpolation (which folds everything above 8 kHz back into speech bands).
"""

from __future__ import annotations

from math import gcd

import numpy as np

ZEROS = 32  # zero crossings of the sinc on each side
ROLLOFF = 0.945  # passband edge as a fraction of the lower Nyquist frequency
BETA = 8.6  # Kaiser window shape: ~-80 dB sidelobes
CHUNK = 1 << 14  # output samples computed per step (bounds the gathered [chunk, taps])


def _table(L: int, c: float) -> tuple[np.ndarray, int]:
    """Filter taps [L, 2K] per phase p (t's fraction p / L), and K, the taps either side."""
    K = int(np.ceil(ZEROS / c)) + 1
    j = np.arange(-K + 1, K + 1, dtype=np.float64)  # tap offsets k - floor(t)
    frac = np.arange(L, dtype=np.float64)[:, None] / L
    d = frac - j[None, :]  # t - k
    half = ZEROS / c
    inside = np.abs(d) < half
    win = np.where(inside, np.i0(BETA * np.sqrt(np.clip(1 - (d / half) ** 2, 0, 1))) /
                   np.i0(BETA), 0.0)
    h = c * np.sinc(c * d) * win
    h /= h.sum(axis=1, keepdims=True)
    return h.astype(np.float32), K


def resample(x: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """x [n] at from_rate -> float32 [ceil(n * to_rate / from_rate)] at to_rate."""
    x = np.asarray(x, np.float32).reshape(-1)
    from_rate, to_rate = int(from_rate), int(to_rate)
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {from_rate} and {to_rate}")
    if from_rate == to_rate or x.size == 0:
        return x.copy()
    g = gcd(from_rate, to_rate)
    L, M = to_rate // g, from_rate // g  # t = m M / L input samples
    h, K = _table(L, ROLLOFF * min(1.0, to_rate / from_rate))
    n_out = -(-x.size * L // M)
    xp = np.concatenate([np.zeros(K, np.float32), x, np.zeros(K + 1, np.float32)])
    out = np.empty(n_out, np.float32)
    taps = np.arange(2 * K)
    for m0 in range(0, n_out, CHUNK):
        m = np.arange(m0, min(n_out, m0 + CHUNK), dtype=np.int64)
        base, phase = (m * M) // L, (m * M) % L
        # x[base - K + 1 + j] is xp[base + 1 + j]
        gathered = xp[base[:, None] + 1 + taps[None, :]]
        out[m0:m0 + m.size] = np.einsum("ij,ij->i", gathered, h[phase])
    return out
