"""Audio input: the WAV reader (encodings, channels, broken headers), the resampler, and
the log-mel front end against faster-whisper's (its log-mel of a clip, stored by
scripts/make-whisper-fixtures.py)."""

import struct

import numpy as np
import pytest
from conftest import FIXTURES

from edgellm.audio import load_audio, log_mel, read_wav, resample
from edgellm.audio.mel import pad_frames
from edgellm.audio.wav import write_wav
from edgellm.errors import AudioError

CLIPS = FIXTURES / "whisper"


def wav_bytes(tag: int, channels: int, rate: int, bits: int, raw: bytes,
              data_size: int | None = None, extensible: bool = False) -> bytes:
    """A WAV file of these fields around `raw` (data_size: what the header claims)."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else tag, channels, rate, rate * align,
                      align, bits)
    if extensible:  # cbSize, valid bits, channel mask, subformat GUID (its first 2 bytes: tag)
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", tag) + bytes(14)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + \
        struct.pack("<I", len(raw) if data_size is None else data_size) + raw
    return b"RIFF" + struct.pack("<I", len(body)) + body


SIGNAL = np.array([[0.0, 0.5], [-0.5, 0.25], [0.999, -1.0]], np.float32)


@pytest.mark.parametrize("bits", [16, 24, 32])
@pytest.mark.parametrize("extensible", [False, True])
def test_integer_wavs_of_every_width_read_as_floats(bits, extensible):
    scale = 2 ** (bits - 1)
    ints = np.clip(np.round(SIGNAL.astype(np.float64) * scale), -scale, scale - 1).astype(np.int64)
    raw = b"".join(int(v).to_bytes(bits // 8, "little", signed=True) for v in ints.reshape(-1))
    x, rate = read_wav(wav_bytes(1, 2, 22050, bits, raw, extensible=extensible))
    assert rate == 22050 and x.shape == (3, 2) and x.dtype == np.float32
    np.testing.assert_allclose(x, ints / scale, atol=1e-7)


def test_float_and_8_bit_wavs():
    x, _ = read_wav(wav_bytes(3, 2, 8000, 32, SIGNAL.astype("<f4").tobytes()))
    np.testing.assert_array_equal(x, SIGNAL)
    x, _ = read_wav(wav_bytes(3, 2, 8000, 64, SIGNAL.astype("<f8").tobytes()))
    np.testing.assert_array_equal(x, SIGNAL)
    x, _ = read_wav(wav_bytes(1, 1, 8000, 8, bytes([0, 128, 255])))
    np.testing.assert_allclose(x[:, 0], [-1.0, 0.0, 127 / 128])


@pytest.mark.parametrize("data, message", [
    (b"not a wav file at all", "not a WAV file"),
    (b"", "not a WAV file"),
    (wav_bytes(1, 1, 16000, 16, b"\x01\x00" * 10, data_size=4000), "claims 4000 bytes"),
    (wav_bytes(1, 1, 16000, 16, b""), "no samples"),
    (wav_bytes(2, 1, 16000, 16, b"\x00" * 8), "encoding 0x2 is not supported"),
    (wav_bytes(1, 1, 16000, 12, b"\x00" * 8), "12-bit integer samples"),
    (wav_bytes(1, 0, 16000, 16, b"\x00" * 8), "inconsistent"),
    (b"RIFF\x04\x00\x00\x00WAVE", "no fmt chunk"),
])
def test_broken_wavs_are_refused_naming_the_problem(data, message):
    with pytest.raises(AudioError, match=message):
        read_wav(data)


def test_a_streamed_wav_without_its_size_reads_to_the_end():
    raw = np.array([100, -100, 200], "<i2").tobytes()
    x, _ = read_wav(wav_bytes(1, 1, 16000, 16, raw, data_size=0xFFFFFFFF))
    np.testing.assert_allclose(x[:, 0], np.array([100, -100, 200]) / 32768)


def test_load_audio_downmixes_resamples_and_checks_arrays(tmp_path):
    t = np.arange(8000 * 2) / 8000
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    write_wav(tmp_path / "s.wav", np.stack([tone, tone], 1), 8000, bits=-32)
    x = load_audio(tmp_path / "s.wav")
    assert x.dtype == np.float32 and x.shape == (32000,)
    exact = 0.5 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)
    assert np.abs(x - exact)[500:-500].max() < 1e-3
    for bad, message in ((np.zeros(0, np.float32), "empty"), (np.zeros(3, np.int16), "floats"),
                         (np.full(3, np.nan, np.float32), "NaN"), (123, "must be a file path"),
                         (tmp_path / "missing.wav", "no such file"),
                         (np.zeros((2, 2, 2), np.float32), "1-D")):
        with pytest.raises(AudioError, match=message):
            load_audio(bad)
    (tmp_path / "a.mp3").write_bytes(b"ID3")  # needs the audio extra, or is not audio
    with pytest.raises(AudioError, match="audio extra|nor audio FFmpeg can decode"):
        load_audio(tmp_path / "a.mp3")


def test_resampling_keeps_the_band_and_removes_what_would_alias():
    t = np.arange(44100) / 44100
    low = resample(np.sin(2 * np.pi * 1000 * t), 44100, 16000)
    assert low.shape == (16000,)
    exact = np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)
    assert np.abs(low - exact)[300:-300].max() < 1e-3
    high = resample(np.sin(2 * np.pi * 10000 * t), 44100, 16000)  # above 8 kHz: must go
    assert np.abs(high[300:-300]).max() < 1e-3  # below -60 dB
    up = resample(np.sin(2 * np.pi * 1000 * np.arange(8000) / 8000), 8000, 16000)
    assert np.abs(up - exact)[300:-300].max() < 1e-3


def test_log_mel_is_faster_whispers():
    with np.load(CLIPS / "frontend.npz") as z:
        ref = z["mel"]
    samples = load_audio(CLIPS / "fox.wav")[:16000]
    mel = log_mel(samples)
    assert mel.shape == ref.shape == (80, 101)
    np.testing.assert_allclose(mel, ref, atol=1e-5)
    window = pad_frames(mel, 3000)  # padded with zeros after normalization
    assert window.shape == (80, 3000) and not window[:, 101:].any()
    assert log_mel(np.zeros(10, np.float32)).shape == (80, 1)  # shorter than half a frame
