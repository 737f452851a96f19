"""WAV files with the standard library: RIFF chunks parsed with `struct`, samples by numpy.

Encodings: PCM integers of 8 (unsigned), 16, 24 or 32 bits and IEEE floats of 32 or 64
bits, in a plain `fmt ` chunk or WAVE_FORMAT_EXTENSIBLE; any channel count and sample
rate. (The `wave` module reads neither floats nor, before Python 3.12, extensible files.)
Integers scale to [-1, 1) by 2^(bits - 1), as ffmpeg and soundfile do. A `data` chunk
that claims more bytes than the file holds is refused (AudioError), not read short, except
for the 0 or 0xFFFFFFFF sizes streaming writers leave behind (then: to the end).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from ..errors import AudioError

PCM, FLOAT, EXTENSIBLE = 1, 3, 0xFFFE
MAX_BYTES = 1 << 32  # a RIFF size field cannot say more


def read_wav(source, where: str | None = None) -> tuple[np.ndarray, int]:
    """(float32 samples [frames, channels] in [-1, 1], sample rate) of a WAV file given as
    a path or its bytes; AudioError naming the problem if it is not one edgellm reads."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), where or "audio"
    else:
        where = where or os.fspath(source)
        try:
            with open(source, "rb") as f:
                data = f.read()
        except OSError as e:
            raise AudioError(f"{where}: cannot read: {e.strerror or e}") from None
    return _parse(data, where)


def _chunks(data: bytes, where: str):
    """(id, offset, size) of each chunk after the RIFF/WAVE header."""
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RIFX") or data[8:12] != b"WAVE":
        raise AudioError(f"{where}: not a WAV file (no RIFF/WAVE header)")
    if data[:4] == b"RIFX":
        raise AudioError(f"{where}: big-endian WAV (RIFX) is not supported")
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        yield cid, pos + 8, size
        pos += 8 + size + (size & 1)  # chunks are padded to even sizes


def _parse(data: bytes, where: str) -> tuple[np.ndarray, int]:
    fmt = None
    for cid, off, size in _chunks(data, where):
        if cid == b"fmt ":
            if size < 16 or off + 16 > len(data):
                raise AudioError(f"{where}: the fmt chunk is truncated")
            fmt = _format(data, off, size, where)
        elif cid == b"data":
            if fmt is None:
                raise AudioError(f"{where}: the data chunk comes before the fmt chunk")
            tag, channels, rate, bits = fmt
            if size in (0, 0xFFFFFFFF):  # a stream's writer did not come back to fill it in
                size = len(data) - off
            elif off + size > len(data):
                raise AudioError(f"{where}: the data chunk claims {size} bytes but the file "
                                 f"holds {len(data) - off} after its header (truncated?)")
            frame = channels * (bits // 8)
            n = size // frame
            if n == 0:
                raise AudioError(f"{where}: no samples")
            return _decode(data[off:off + n * frame], tag, bits, channels), rate
    raise AudioError(f"{where}: no " + ("data" if fmt else "fmt") + " chunk")


def _format(data: bytes, off: int, size: int, where: str) -> tuple[int, int, int, int]:
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", data, off)
    if tag == EXTENSIBLE:
        if size < 40 or off + 40 > len(data):
            raise AudioError(f"{where}: the extensible fmt chunk is truncated")
        tag = struct.unpack_from("<H", data, off + 24)[0]  # the subformat GUID's first field
    if tag not in (PCM, FLOAT):
        raise AudioError(f"{where}: WAV encoding {tag:#x} is not supported (PCM integers or "
                         "IEEE floats; compressed audio needs a decoder)")
    ok = bits in ((8, 16, 24, 32) if tag == PCM else (32, 64))
    if not ok:
        kind = "integer" if tag == PCM else "float"
        raise AudioError(f"{where}: {bits}-bit {kind} samples are not supported")
    if channels < 1 or rate < 1 or align != channels * bits // 8:
        raise AudioError(f"{where}: the fmt chunk is inconsistent ({channels} channels, "
                         f"{rate} Hz, {bits} bits, block align {align})")
    return tag, channels, rate, bits


def _decode(raw: bytes, tag: int, bits: int, channels: int) -> np.ndarray:
    """float32 [frames, channels] of the raw little-endian samples."""
    if tag == FLOAT:
        x = np.frombuffer(raw, "<f4" if bits == 32 else "<f8").astype(np.float32)
        x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    elif bits == 8:  # unsigned, centred on 128
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif bits == 24:  # three bytes: widened into the top of an int32
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = (b[:, 0] << 8) | (b[:, 1] << 16) | (b[:, 2] << 24)
        x = v.astype(np.float32) / np.float32(2.0 ** 31)
    else:
        x = np.frombuffer(raw, "<i2" if bits == 16 else "<i4").astype(np.float32)
        x /= np.float32(2.0 ** (bits - 1))
    return x.reshape(-1, channels)


def write_wav(path, samples: np.ndarray, rate: int, bits: int = 16) -> None:
    """Write float samples [n] or [n, channels] in [-1, 1] as a PCM WAV (16 or 32 bits)
    or, with bits=-32, IEEE float32 (for tests and fixtures)."""
    x = np.asarray(samples, np.float64)
    x = x.reshape(len(x), -1)
    channels = x.shape[1]
    if bits == -32:
        raw, tag, width = x.astype("<f4").tobytes(), FLOAT, 32
    else:
        scale = 2.0 ** (bits - 1)
        raw = np.clip(np.round(x * scale), -scale, scale - 1).astype(
            "<i2" if bits == 16 else "<i4").tobytes()
        tag, width = PCM, bits
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * channels * width // 8,
                      channels * width // 8, width)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + \
        struct.pack("<I", len(raw)) + raw
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", len(body)) + body)
