"""Compressed audio through the `audio` extra (PyAV): files made here by sox (flac, ogg)
and by PyAV's own encoders (mp3, m4a, webm) decode to the WAV's samples (exactly for
flac, closely for the lossy ones), by path or bytes; without PyAV the error names the
extra."""

import shutil
import subprocess
import sys

import debian_packages
import numpy as np
import pytest
from conftest import FIXTURES

from edgellm.audio import load_audio
from edgellm.errors import AudioError

FOX = FIXTURES / "whisper" / "fox.wav"


def sox(tmp_path, ext):
    """The fox clip converted by sox to `ext` (Debian's sox, installed here where missing
    and possible: debian_packages.py)."""
    if shutil.which("sox") is None:
        why = debian_packages.install("sox")
        if shutil.which("sox") is None:
            pytest.skip(f"sox is not installed ({why or 'apt-get installed no sox binary'})")
    out = tmp_path / f"fox.{ext}"
    subprocess.run(["sox", str(FOX), str(out)], check=True)
    return out


def encode(tmp_path, ext, codec, rate):
    av = pytest.importorskip("av")
    x = load_audio(FOX)
    out = tmp_path / f"fox.{ext}"
    with av.open(str(out), "w") as c:
        s = c.add_stream(codec, rate=rate)
        s.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.round(x * 32767).astype(np.int16)[None],
                                           format="s16", layout="mono")
        frame.sample_rate = 16000
        for p in [*s.encode(frame), *s.encode(None)]:
            c.mux(p)
    return out


def similar(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of b with a at the best lag within 128 ms (encoders add a delay: AAC's
    priming is 1,024 samples)."""
    n = min(a.size, b.size) - 2048
    best = 0.0
    for lag in range(0, 2048, 2):
        for x, y in ((a[:n], b[lag:lag + n]), (a[lag:lag + n], b[:n])):
            best = max(best, float(np.corrcoef(x, y)[0, 1]))
    return best


def test_flac_is_the_wav_exactly(tmp_path):
    pytest.importorskip("av")
    path = sox(tmp_path, "flac")
    wav = load_audio(FOX)
    np.testing.assert_array_equal(load_audio(path), wav)
    np.testing.assert_array_equal(load_audio(path.read_bytes()), wav)  # bytes too
    np.testing.assert_array_equal(load_audio(str(path)), wav)


@pytest.mark.parametrize("ext, codec, rate", [("ogg", None, None), ("mp3", "libmp3lame", 16000),
                                              ("m4a", "aac", 16000), ("webm", "libopus", 48000)])
def test_lossy_formats_decode_to_the_speech(tmp_path, ext, codec, rate):
    pytest.importorskip("av")
    path = sox(tmp_path, ext) if codec is None else encode(tmp_path, ext, codec, rate)
    wav, x = load_audio(FOX), load_audio(path)
    assert x.dtype == np.float32 and abs(x.size - wav.size) < 0.25 * 16000  # codec padding
    assert similar(wav, x) > 0.95


def test_without_pyav_the_error_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "a.ogg"
    path.write_bytes(b"OggS")
    monkeypatch.setitem(sys.modules, "av", None)  # import av fails
    with pytest.raises(AudioError, match=r"a\.ogg: compressed audio needs the audio extra "
                                         r"\(PyAV\): pip install 'edgellm\[audio\]'"):
        load_audio(path)
    with pytest.raises(AudioError, match="not a WAV file"):  # bytes: WAV is all we read
        load_audio(b"OggS....")


def test_not_audio_is_refused(tmp_path):
    pytest.importorskip("av")
    path = tmp_path / "a.mp3"
    path.write_bytes(b"this is text, not audio" * 10)
    with pytest.raises(AudioError, match="a.mp3: not a WAV file, nor audio FFmpeg can decode"):
        load_audio(path)
    with pytest.raises(AudioError, match="not a WAV file"):
        load_audio(b"hello")
