"""Quantization types as data, and the numpy reference quantize/dequantize for each.

This module is the oracle: the converter writes what it computes and every Numba kernel is
tested against `dequantize`. Rounding follows llama.cpp's reference C code
(`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`), in float32,
so the same float weights give the same bytes whether they arrive as safetensors or GGUF.

Block layouts (ggml's, generalized to block size B; B = 32 is exactly ggml's):
  q8_0: [f16 d][B x int8 q]                value = d * q
  q4_0: [f16 d][B/2 bytes]                 value = d * (q - 8)
  q4_1: [f16 d][f16 m][B/2 bytes]          value = d * q + m
  4-bit bytes: byte j holds element j in its low nibble and element j + B/2 in its high one.
A quantized tensor of shape [rows, cols] is stored as uint8 [rows, (cols // B) * block_bytes]:
rows contiguous, blocks along the columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import QuantizationError

BLOCK_SIZES = (32, 64, 128)
DEFAULT_BLOCK = 32


@dataclass(frozen=True)
class QuantType:
    """A storage type: name, whether it is block-quantized, and its block byte layout."""

    name: str
    quantized: bool
    header_bytes: int = 0  # f16 scale (and f16 minimum) at the start of each block
    bits: int = 0  # bits per quantized element

    def block_bytes(self, block_size: int) -> int:
        """Bytes of one block of `block_size` elements."""
        return self.header_bytes + block_size * self.bits // 8

    def row_bytes(self, cols: int, block_size: int = DEFAULT_BLOCK) -> int:
        """Bytes of one stored row of `cols` elements."""
        if not self.quantized:
            return cols * FLOAT_ITEMSIZE[self.name]
        return (cols // block_size) * self.block_bytes(block_size)

    def nbytes(self, shape: tuple[int, ...], block_size: int = DEFAULT_BLOCK) -> int:
        """Bytes of a whole tensor of `shape` (quantized tensors are 2-D [rows, cols])."""
        if not self.quantized:
            return int(np.prod(shape, dtype=np.int64)) * FLOAT_ITEMSIZE[self.name]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        return rows * self.row_bytes(shape[-1], block_size)


FLOAT_ITEMSIZE = {"f32": 4, "f16": 2}
FLOAT_DTYPE = {"f32": np.float32, "f16": np.float16}

TYPES: dict[str, QuantType] = {
    "f32": QuantType("f32", False),
    "f16": QuantType("f16", False),
    "q8_0": QuantType("q8_0", True, header_bytes=2, bits=8),
    "q4_0": QuantType("q4_0", True, header_bytes=2, bits=4),
    "q4_1": QuantType("q4_1", True, header_bytes=4, bits=4),
}
QUANTIZED = tuple(n for n, t in TYPES.items() if t.quantized)


def qtype(name: str) -> QuantType:
    """The QuantType called `name`; QuantizationError for an unknown name."""
    try:
        return TYPES[name]
    except KeyError:
        raise QuantizationError(
            f"unknown quantization type {name!r} (known: {', '.join(TYPES)})"
        ) from None


def check_quantizable(name: str, shape: tuple[int, ...], block_size: int) -> None:
    """Raise QuantizationError unless a tensor of `shape` can be block-quantized."""
    if block_size not in BLOCK_SIZES:
        raise QuantizationError(f"block size {block_size} is not one of {BLOCK_SIZES}")
    if len(shape) != 2 or shape[-1] % block_size:
        raise QuantizationError(
            f"tensor {name}: shape {list(shape)} cannot be split into blocks of {block_size}"
        )


def _blocks(x: np.ndarray, block_size: int) -> np.ndarray:
    """x [rows, cols] -> float32 [rows, nb, B]."""
    rows, cols = x.shape
    return np.ascontiguousarray(x, dtype=np.float32).reshape(rows, cols // block_size, block_size)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 [rows, nb] -> uint8 [rows, nb, 2] (little-endian f16)."""
    return v.astype("<f2").view(np.uint8).reshape(*v.shape, 2)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 [rows, nb, B] of values 0..15 -> uint8 [rows, nb, B/2]."""
    half = q.shape[-1] // 2
    return (q[..., :half] | (q[..., half:] << 4)).astype(np.uint8)


def _unpack_nibbles(p: np.ndarray) -> np.ndarray:
    """uint8 [rows, nb, B/2] -> uint8 [rows, nb, B]."""
    return np.concatenate([p & 0x0F, p >> 4], axis=-1)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d, and 0 where d is 0 or so small that 1/d overflows (its f16 scale is 0 anyway)."""
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1) / d
    return np.where(np.isfinite(inv), inv, np.float32(0)).astype(np.float32)


def _quantize_q8_0(xb: np.ndarray) -> np.ndarray:
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    inv = _inverse(d)
    # C's roundf: halves away from zero (np.round would round them to even).
    v = xb * inv[..., None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=-1)


def _quantize_q4_0(xb: np.ndarray) -> np.ndarray:
    # The signed value of largest magnitude maps to -8 (first one wins, as in the C loop).
    idx = np.abs(xb).argmax(axis=-1)
    vmax = np.take_along_axis(xb, idx[..., None], axis=-1)[..., 0]
    d = vmax / np.float32(-8)
    inv = _inverse(d)
    # (int8_t)(x*id + 8.5f) truncates toward zero; then MIN(15, .)
    q = np.minimum(15, np.trunc(xb * inv[..., None] + np.float32(8.5)).astype(np.int32))
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q.astype(np.uint8))], axis=-1)


def _quantize_q4_1(xb: np.ndarray) -> np.ndarray:
    vmin = xb.min(axis=-1)
    vmax = xb.max(axis=-1)
    d = (vmax - vmin) / np.float32(15)
    inv = _inverse(d)
    v = (xb - vmin[..., None]) * inv[..., None] + np.float32(0.5)
    q = np.minimum(15, np.trunc(v).astype(np.int32))
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(vmin), _pack_nibbles(q.astype(np.uint8))], axis=-1
    )


_QUANTIZERS = {"q8_0": _quantize_q8_0, "q4_0": _quantize_q4_0, "q4_1": _quantize_q4_1}


def quantize(x: np.ndarray, type_name: str, block_size: int = DEFAULT_BLOCK,
             name: str = "tensor") -> np.ndarray:
    """Quantize x [rows, cols] (any float dtype) to uint8 [rows, row_bytes] blocks.

    Float types return the array converted (f32 or f16). NaN or inf -> QuantizationError
    naming the tensor.
    """
    t = qtype(type_name)
    x = np.asarray(x)
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise QuantizationError(f"tensor {name}: {bad} NaN or infinite values")
    if not t.quantized:
        return np.ascontiguousarray(x, dtype=FLOAT_DTYPE[type_name])
    check_quantizable(name, x.shape, block_size)
    blocks = _QUANTIZERS[type_name](_blocks(x, block_size))
    return np.ascontiguousarray(blocks.reshape(x.shape[0], -1))


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...],
               block_size: int = DEFAULT_BLOCK) -> np.ndarray:
    """Stored data (uint8 blocks, or a float array) -> float32 array of `shape`."""
    t = qtype(type_name)
    if not t.quantized:
        return np.asarray(data, dtype=np.float32).reshape(shape)
    rows, cols = shape
    nb = cols // block_size
    raw = np.asarray(data, dtype=np.uint8).reshape(rows, nb, t.block_bytes(block_size))
    d = raw[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)[..., None]
    if type_name == "q8_0":
        q = raw[..., 2:].copy().view(np.int8).astype(np.float32)
        out = d * q
    elif type_name == "q4_0":
        q = _unpack_nibbles(raw[..., 2:]).astype(np.float32)
        out = d * (q - np.float32(8))
    else:
        m = raw[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32)[..., None]
        q = _unpack_nibbles(raw[..., 4:]).astype(np.float32)
        out = d * q + m
    return out.reshape(rows, cols).astype(np.float32)


def quantize_activations_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference int8 activation quantization, blocks of 32 (llama.cpp's q8_0 rounding).

    x float32 [..., K] -> (xq int8 [..., K], xd float32 [..., K/32], xsum int32 [..., K/32]).
    The scale stays float32 (not rounded to f16): activations never leave memory.
    """
    x = np.asarray(x, dtype=np.float32)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    inv = _inverse(d)
    v = xb * inv[..., None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    return q.reshape(x.shape), d.astype(np.float32), q.astype(np.int32).sum(axis=-1)
