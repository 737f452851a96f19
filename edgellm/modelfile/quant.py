"""Quantization types as one table, and the numpy reference quantize/dequantize of each.

`TYPES` has one row (`QuantType`) per storage type: its name and number, its block layout,
the numpy reference that defines it, and which kernels edgellm has for it. The loader
(format.py), validation, the linear kernels (kernels/registry.py), the fused decode step,
the converter and `edgellm info` read these rows instead of keeping their own lists; the
kernels find a type by its code. Adding a type is a row here plus a line in
kernels/tiles.py's RECIPES (its kernel family is generated from its tiles). A sized type's
row describes its block (`Packing`: the f16 fields, the code bytes, the value formula) and the
code generators read that description, not the type's name (README, Development).

This module is the oracle: the converter writes what it computes and every Numba kernel is
tested against `dequantize`. Rounding follows llama.cpp's reference C code
(`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`), in float32,
so the same float weights give the same bytes whether they arrive as safetensors or GGUF.

Block layouts (ggml's, generalized to block size B; B = 32 is exactly ggml's):
  q8_0: [f16 d][B x int8 q]                value = d * q
  q4_0: [f16 d][B/2 bytes]                 value = d * (q - 8)
  q4_1: [f16 d][f16 m][B/2 bytes]          value = d * q + m
  iq4_nl: [f16 d][B/2 bytes] (B = 32 only) value = d * IQ4_NL_VALUES[q] (ggml's non-linear
        16 levels; quantized by ggml's best-scale search, _quantize_iq4_nl)
  4-bit bytes: byte j holds element j in its low nibble and element j + B/2 in its high one.
A quantized tensor of shape [rows, cols] is stored as uint8 [rows, (cols // B) * block_bytes]:
rows contiguous, blocks along the columns.

ggml's K-quants (q2_k .. q6_k: super-blocks of 256), q5_0 and q5_1 (blocks of 32) have one fixed
block size each (`QuantType.blocks`); their layouts and reference code: quant_k.py. iq4_nl
has one too (32), with its reference here and its kernels generated from its `Packing`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import QuantizationError
from . import quant_k

BLOCK_SIZES = (32, 64, 128)
DEFAULT_BLOCK = 32
F16_MAX = 65504.0
ACT_BLOCK = 32  # the int8 kernels' activations: blocks of 32 in q8_0's rounding (ActQ8)


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



def _f16_at(raw: np.ndarray, off: int) -> np.ndarray:
    """uint8 [rows, nb, block_bytes] -> float32 [rows, nb, 1]: the f16 at byte off of each block."""
    return raw[..., off:off + 2].copy().view("<f2")[..., 0].astype(np.float32)[..., None]



@dataclass(frozen=True)
class Packing:
    """A sized type's block as the code generators read it (codegen/, kernels/panel.py):

    scales  the f16 fields at the block's start, in order: ("d",) or ("d", "m")
    codes   "int8": B signed bytes; "nibbles": B/2 bytes, byte j holding element j in its
            low nibble and element j + B/2 in its high one (a new plane of codes: a branch
            in codes_of and in codegen/packing.py's `codes`)
    zero    value d (q - zero) (q4_0: 8)
    table   value d table[q]: the int8 level each code stands for (iq4_nl)
    With "m" among the scales the value is d q + m (4-bit codes).
    The generators' three forms: `signed` (value d w, w an int8 weight: the int8 bytes, the
    table's level or q - zero; run as q8_0's tiles and panels, w decoded in the tile), the
    nibbles' offset (d (q - zero), q4_0) and `affine` (d q + m, q4_1), these two with the
    offset or minimum folded in per block (codegen/packing.py).
    """

    scales: tuple[str, ...] = ("d",)
    codes: str = "nibbles"
    zero: int = 0
    table: tuple[int, ...] = ()

    def __post_init__(self):
        assert not self.affine or self.codes == "nibbles" and not self.table, self

    @property
    def signed(self) -> bool:
        """value = d w with w an int8 weight decoded from the block (the bytes, the table's
        level, or q - zero of codes other than nibbles)."""
        return self.codes != "nibbles" or bool(self.table)

    def codes_of(self, body: np.ndarray) -> np.ndarray:
        """The code bytes uint8 [rows, nb, .] -> the codes q, uint8 [rows, nb, B]."""
        if self.codes == "nibbles":
            return _unpack_nibbles(body)
        raise NotImplementedError(f"no reference reads {self.codes!r} codes")

    @property
    def affine(self) -> bool:
        """value = d q + m."""
        return "m" in self.scales

    @property
    def header_bytes(self) -> int:
        return 2 * len(self.scales)

    def weights(self, raw: np.ndarray) -> np.ndarray:
        """uint8 [rows, nb, block_bytes] -> float32 [rows, nb, B]: w (signed), q - zero, or q."""
        body = raw[..., self.header_bytes:]
        if self.codes == "int8":
            return body.copy().view(np.int8).astype(np.float32)
        q = self.codes_of(body)
        if self.table:
            return np.asarray(self.table, np.float32)[q]
        q = q.astype(np.float32)
        return q - np.float32(self.zero) if self.zero else q

    def dequantize(self, raw: np.ndarray) -> np.ndarray:
        """The reference dequantization of the blocks raw [rows, nb, block_bytes]."""
        v = _f16_at(raw, 0) * self.weights(raw)
        return v + _f16_at(raw, 2) if self.affine else v


IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _best_index(values: np.ndarray, v: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8: the index of the level nearest v (a tie: the higher one)."""
    n = len(values)
    mu = np.clip(np.searchsorted(values, v, side="right"), 1, n - 1)
    idx = np.where(v - values[mu - 1] < values[mu] - v, mu - 1, mu)
    return np.where(v <= values[0], 0, np.where(v >= values[-1], n - 1, idx))


def _fit(xb: np.ndarray, w: np.ndarray, values: np.ndarray, inv: np.ndarray):
    """Codes for scale 1/inv and the weighted sums (sum w q x, sum w q^2), in C's order."""
    idx = _best_index(values, inv[..., None] * xb)
    q = values[idx]
    return idx, np.cumsum(w * q * xb, -1, dtype=np.float32)[..., -1], \
        np.cumsum(w * q * q, -1, dtype=np.float32)[..., -1]


def _quantize_iq4_nl(xb: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_iq4_nl_ref (no importance): per block the scale -max/values[0],
    then 15 tries id = (k + values[0]) / max, k = -7..7, keeping the least weighted error
    (weights x^2) with d refit by least squares; codes rounded for the final float d."""
    values = np.asarray(IQ4_NL_VALUES, np.float32)
    w = xb * xb
    idx = np.abs(xb).argmax(axis=-1)  # the first of the largest magnitude, as C's loop
    vmax = np.take_along_axis(xb, idx[..., None], axis=-1)[..., 0]
    zero = np.abs(vmax) < np.float32(1e-15)
    safe = np.where(zero, np.float32(1), vmax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _, sqx, sq2 = _fit(xb, w, values, np.float32(1) / (-safe / values[0]))
        d = sqx / sq2
        best = d * sqx
        for k in range(-7, 8):
            _, sqx, sq2 = _fit(xb, w, values, (np.float32(k) + values[0]) / safe)
            better = (sq2 > 0) & (sqx * sqx > best * sq2)
            d = np.where(better, sqx / sq2, d)
            best = np.where(better, d * sqx, best)
        d = np.where(zero, np.float32(0), d).astype(np.float32)
        idx, _, _ = _fit(xb, w, values, _inverse(d))
    return np.concatenate([_f16_bytes(d), _pack_nibbles(idx.astype(np.uint8))], axis=-1)


Blocks = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class QuantType:
    """One storage type: a row of `TYPES`.

    code          its number where kernels need one (the fused decode step's matrix table)
    ggml          ggml's name of the same bytes (GGUF tensors of it are copied, not requantized)
    layout        one block's bytes and the value they stand for
    bits          bits per quantized element; 0 for a float type (itemsize bytes per element)
    header_bytes  the f16 scale (and f16 minimum) at the start of each block
    codes         (lowest, highest) integer code q as stored; affine: value = d q + m,
                  with a table (packing): d table[q], else d q
    max_abs       the largest |value| it stores (float16 scales), None for no limit
    quantize_blocks / dequantize_blocks   the reference: float32 [rows, nb, B] <-> uint8
                  [rows, nb, block_bytes] (float types: None, they are only converted)
    int8_kernels  matvec / matmul kernels on int8 activation blocks of ACT_BLOCK (ActQ8),
                  with prefill's 8-row panels (kernels/panel.py; generated from the
                  type's recipe, kernels/tiles.py; q4_k, q5_k, q6_k: kernels/kquant_int.py;
                  q2_k, q3_k: float only, kernels/kquant.py)
    float_kernels matvec / matmul on float32 activations and the embedding lookup
    blocks        the block sizes it can be stored in (K-quants: 256 only; q5_0: 32)
    packing       its block as the code generators read it (`Packing`), for the types whose
                  tiles codegen/int8_tiles.py, float_tiles.py and kernels/panel.py make
    The kernels themselves: kernels/registry.py, by type code.
    """

    name: str
    code: int
    ggml: str
    layout: str
    bits: int = 0
    itemsize: int = 0
    header_bytes: int = 0
    codes: tuple[int, int] = (0, 0)
    affine: bool = False
    max_abs: float | None = None
    quantize_blocks: Blocks | None = None
    dequantize_blocks: Blocks | None = None
    int8_kernels: bool = False
    float_kernels: bool = True
    blocks: tuple[int, ...] = BLOCK_SIZES
    packing: Packing | None = None

    @property
    def superblock(self) -> bool:
        """One fixed block size (K-quants, q5_0, q5_1: float kernels in kernels/kquant.py;
        iq4_nl)."""
        return self.quantized and len(self.blocks) == 1

    def is_ggml_block(self, block_size: int) -> bool:
        """Whether this type stored at `block_size` is ggml's own block (GGUF bytes as they
        are): 32 for q8_0/q4_0/q4_1, the fixed size of the others."""
        return self.block_for(block_size) == (self.blocks[0] if self.superblock else 32)

    def block_for(self, block_size: int) -> int:
        """The block size a tensor of this type is stored in when `block_size` is asked:
        the type's own where it has one fixed size, else block_size."""
        return self.blocks[0] if len(self.blocks) == 1 else block_size

    @property
    def quantized(self) -> bool:
        """Block-quantized (stored as uint8 blocks), not a float type."""
        return self.bits > 0

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of the stored data: uint8 blocks, or the float type's own."""
        return np.dtype(np.uint8 if self.quantized else FLOAT_DTYPE[self.name])

    def block_bytes(self, block_size: int) -> int:
        """Bytes of one block of `block_size` elements (the type's own size if it has one)."""
        block_size = self.block_for(block_size)
        return self.header_bytes + block_size * self.bits // 8

    def bits_per_weight(self, block_size: int = DEFAULT_BLOCK) -> float:
        """Stored bits per element, scales included."""
        if not self.quantized:
            return 8.0 * self.itemsize
        block_size = self.block_for(block_size)
        return 8.0 * self.block_bytes(block_size) / block_size

    def row_bytes(self, cols: int, block_size: int = DEFAULT_BLOCK) -> int:
        """Bytes of one stored row of `cols` elements."""
        if not self.quantized:
            return cols * self.itemsize
        block_size = self.block_for(block_size)
        return (cols // block_size) * self.block_bytes(block_size)

    def nbytes(self, shape: tuple[int, ...], block_size: int = DEFAULT_BLOCK) -> int:
        """Bytes of a whole tensor of `shape` (quantized tensors are 2-D [rows, cols])."""
        if not self.quantized:
            return int(np.prod(shape, dtype=np.int64)) * self.itemsize
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        return rows * self.row_bytes(shape[-1], block_size)


FLOAT_DTYPE = {"f32": np.float32, "f16": np.float16}


def _ref(name: str) -> dict:
    """quant_k.py's reference for `name`, with its kernels (kernels/kquant.py)."""
    return dict(quantize_blocks=quant_k.QUANTIZE_BLOCKS[name],
                dequantize_blocks=quant_k.DEQUANTIZE_BLOCKS[name])


def _packed(p: Packing) -> dict:
    """A sized type's packing and the dequantization it defines."""
    return dict(packing=p, dequantize_blocks=p.dequantize)


# K-quants with integer-activation kernels too (kernels/kquant_int.py)
INT_K_TYPES = ("q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
TYPES: dict[str, QuantType] = {t.name: t for t in (
    QuantType("f32", 0, "F32", "float32 values", itemsize=4),
    QuantType("f16", 1, "F16", "float16 values", itemsize=2, max_abs=F16_MAX),
    QuantType("q8_0", 2, "Q8_0", "[f16 d][B x int8 q], value d q", bits=8, header_bytes=2,
              codes=(-127, 127), max_abs=F16_MAX * 127, quantize_blocks=_quantize_q8_0,
              int8_kernels=True, **_packed(Packing(codes="int8"))),
    QuantType("q4_0", 3, "Q4_0", "[f16 d][B/2 bytes of 4-bit q], value d (q - 8)", bits=4,
              header_bytes=2, codes=(-8, 7), max_abs=F16_MAX * 8,
              quantize_blocks=_quantize_q4_0, int8_kernels=True, **_packed(Packing(zero=8))),
    QuantType("q4_1", 4, "Q4_1", "[f16 d][f16 m][B/2 bytes of 4-bit q], value d q + m",
              bits=4, header_bytes=4, codes=(0, 15), affine=True, max_abs=F16_MAX,
              quantize_blocks=_quantize_q4_1, int8_kernels=True,
              **_packed(Packing(scales=("d", "m")))),
    QuantType("q5_0", 5, "Q5_0", "[f16 d][u32 high bits][B/2 bytes of low nibbles], value "
              "d (q - 16)", bits=5, header_bytes=2, codes=(-16, 15), max_abs=F16_MAX * 16,
              blocks=(32,), int8_kernels=True, **_ref("q5_0")),
    QuantType("q5_1", 11, "Q5_1", "[f16 d][f16 m][u32 high bits][B/2 bytes of low nibbles], "
              "value d q + m", bits=5, header_bytes=4, codes=(0, 31), affine=True,
              max_abs=F16_MAX, blocks=(32,), int8_kernels=True, **_ref("q5_1")),
    *(QuantType(name, code, name.upper(), layout, bits=bits, header_bytes=hdr, blocks=(256,),
                max_abs=F16_MAX, int8_kernels=name in INT_K_TYPES, **_ref(name))
      for name, code, bits, hdr, layout in (
          ("q2_k", 6, 2, 20, "[16 B 4-bit scales|mins][64 B 2-bit q][f16 d][f16 dmin], value "
                             "d sc q - dmin m"),
          ("q3_k", 7, 3, 14, "[32 B high bits][64 B 2-bit q][12 B 6-bit scales][f16 d], "
                             "value d (sc - 32) q, q -4..3"),
          ("q4_k", 8, 4, 16, "[f16 d][f16 dmin][12 B 6-bit scales, mins][128 B 4-bit q], "
                             "value d sc q - dmin m"),
          ("q5_k", 9, 5, 16, "[f16 d][f16 dmin][12 B 6-bit scales, mins][32 B high bits]"
                             "[128 B 4-bit q], value d sc q - dmin m"),
          ("q6_k", 10, 6, 18, "[128 B low nibbles][64 B 2-bit high][16 int8 scales][f16 d], "
                              "value d sc (q - 32)"),
      )),
    QuantType("iq4_nl", 12, "IQ4_NL", "[f16 d][B/2 bytes of 4-bit q], value d IQ4_NL_VALUES[q]",
              bits=4, header_bytes=2, codes=(0, 15), max_abs=F16_MAX * 127, blocks=(32,),
              quantize_blocks=_quantize_iq4_nl, int8_kernels=True,
              **_packed(Packing(table=IQ4_NL_VALUES))),
)}
FLOAT_ITEMSIZE = {n: t.itemsize for n, t in TYPES.items() if not t.quantized}
QUANTIZED = tuple(n for n, t in TYPES.items() if t.quantized)
MATRIX_TYPES = tuple(n for n, t in TYPES.items() if t.float_kernels)  # what linear() runs
INT8_TYPES = tuple(n for n, t in TYPES.items() if t.int8_kernels)  # int8 activations too
FLOAT_TYPES = tuple(n for n, t in TYPES.items() if not t.quantized)
K_TYPES = tuple(n for n, t in TYPES.items() if t.superblock)  # q5_0, q5_1, the K-quants
SIZED_TYPES = tuple(n for n in QUANTIZED if n not in K_TYPES)  # block size chosen (32/64/128)


def qtype(name: str) -> QuantType:
    """The QuantType called `name`; QuantizationError for an unknown name."""
    try:
        return TYPES[name]
    except KeyError:
        raise QuantizationError(
            f"unknown quantization type {name!r} (known: {', '.join(TYPES)})"
        ) from None


def check_quantizable(name: str, shape: tuple[int, ...], block_size: int,
                      type_name: str | None = None) -> None:
    """Raise QuantizationError unless a tensor of `shape` can be block-quantized."""
    allowed = qtype(type_name).blocks if type_name else BLOCK_SIZES
    if block_size not in allowed:
        raise QuantizationError(f"block size {block_size} is not one of {allowed}"
                                + (f" for {type_name}" if type_name else ""))
    if len(shape) != 2 or shape[-1] % block_size:
        raise QuantizationError(
            f"tensor {name}: shape {list(shape)} cannot be split into blocks of {block_size}"
        )


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
    block_size = t.block_for(block_size)
    check_quantizable(name, x.shape, block_size, type_name)
    blocks = t.quantize_blocks(_blocks(x, block_size))
    return np.ascontiguousarray(blocks.reshape(x.shape[0], -1))


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...],
               block_size: int = DEFAULT_BLOCK) -> np.ndarray:
    """Stored data (uint8 blocks, or a float array) -> float32 array of `shape`."""
    t = qtype(type_name)
    if not t.quantized:
        return np.asarray(data, dtype=np.float32).reshape(shape)
    rows, cols = shape
    block_size = t.block_for(block_size)
    raw = np.asarray(data, dtype=np.uint8).reshape(rows, cols // block_size,
                                                   t.block_bytes(block_size))
    return t.dequantize_blocks(raw).reshape(rows, cols).astype(np.float32)


def quantize_activations_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference int8 activation quantization, blocks of 32 (llama.cpp's q8_0 rounding).

    x float32 [..., K] -> (xq int8 [..., K], xd float32 [..., K/32], xsum int32 [..., K/32]).
    The scale stays float32 (not rounded to f16): activations never leave memory.
    """
    x = np.asarray(x, dtype=np.float32)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // ACT_BLOCK, ACT_BLOCK)
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    inv = _inverse(d)
    v = xb * inv[..., None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    return q.reshape(x.shape), d.astype(np.float32), q.astype(np.int32).sum(axis=-1)


def quantize_activations_q16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference int16 activation quantization, blocks of 32: q8's rounding, d = amax / 32767.

    x float32 [..., K] -> (xq int16 [..., K], xd float32 [..., K/32], xsum int32 [..., K/32]).
    Relative error ~1e-5 of the block's largest value (int8: ~4e-3).
    """
    x = np.asarray(x, dtype=np.float32)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // ACT_BLOCK, ACT_BLOCK)
    d = np.abs(xb).max(axis=-1) / np.float32(32767)
    v = xb * _inverse(d)[..., None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int16)
    return q.reshape(x.shape), d.astype(np.float32), q.astype(np.int32).sum(axis=-1)
