"""K/V rows of the cache: encoding float32 -> float16 bits / ggml q8_0 blocks (and f16 rows
back to float32 in bulk: decode_f16, for a prefill chunk's attention), and the row
accessors compiled kernels read and write a cache of any kv_type with (kv_rows,
store_kv_row).

Bit for bit numpy's float16 conversion (round to nearest even) and quant.py's q8_0
reference (d = amax / 127 in float32, q = roundf(x / d) with halves away from zero, d
stored as float16), in a compiled loop: numpy's versions pay a call's overhead and
temporaries each time, and decode calls this twice per layer per token.
"""

import numpy as np
from numba import prange, types
from numba.extending import overload

from ..modelfile import quant
from . import family, tiles  # noqa: F401  (tiles: fills family.TILES)
from .jit import kernel

# the cache types stored as rows of a matrix type, by row dtype: their row dequantizers
_F16 = quant.TYPES["f16"].code
DECODE_ROWS = 64  # rows a work item of decode_f16 converts
_ROW_TYPE = {types.uint16: _F16, types.uint8: quant.TYPES["q8_0"].code}


@kernel(exact=True)
def f16_bits(u):
    """The float16 bit pattern (as int) nearest to the float32 whose bits are u."""
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:  # inf, nan
        return sign | 0x7C00 | (0x200 if a > 0x7F800000 else 0)
    if a >= 0x47800000:  # 65536 and up: inf (65520.. rounds there below)
        return sign | 0x7C00
    if a >= 0x38800000:  # normal: rebias the exponent, round the 13 dropped bits to even
        r = a - 0x38000000
        r = r + 0xFFF + ((r >> 13) & 1)
        return sign | (r >> 13)
    if a < 0x33000000:  # below half the smallest subnormal: zero
        return sign
    e = a >> 23  # subnormal: m * 2^(e - 150) in units of 2^-24
    m = (a & 0x7FFFFF) | 0x800000
    s = 126 - e
    q = m >> s
    rem = m & ((1 << s) - 1)
    half = 1 << (s - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return sign | q


@kernel(exact=True)
def encode_f16(xbits, out):
    """out [N, D] uint16 = float16 bits of the float32 whose bits are xbits [N, D] (uint32)."""
    N, D = xbits.shape
    for r in range(N):
        for i in range(D):
            out[r, i] = f16_bits(np.int64(xbits[r, i]))


@kernel(exact=True)
def encode_q8_0(x, out):
    """out [N, D/32 * 34] uint8 = ggml q8_0 blocks of x [N, D] float32 (D % 32 == 0)."""
    N, D = x.shape
    scratch = np.empty(1, np.float32)
    bits = scratch.view(np.uint32)
    for r in range(N):
        for b in range(D // 32):
            base = b * 34
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[r, b * 32 + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            if not np.isfinite(inv):
                inv = np.float32(0.0)
            scratch[0] = d
            h = f16_bits(np.int64(bits[0]))
            out[r, base] = h & 0xFF
            out[r, base + 1] = h >> 8
            for j in range(32):
                v = x[r, b * 32 + j] * inv
                q = np.floor(abs(v) + np.float32(0.5))
                q = -q if v < 0 else q
                out[r, base + 2 + j] = np.uint8(np.int64(q) & 0xFF)


# Reading and writing one KV head's cached rows inside a compiled kernel, whatever the
# cache's kv_type (the fused decode step's attention, decode_step._attend_group): numba
# picks the implementation by the rows' dtype (float32, uint16: f16 bits, uint8: q8_0).

def kv_rows(rows, s, m, tile):
    """(src, r): rows s .. s + m - 1 of a KV head's cache rows [n, width] as float32 rows
    src[r] .. src[r + m - 1]. A float32 cache is its own source (src = rows, r = s); f16 and
    q8_0 rows are decoded into tile [>= m, Dh] (src = tile, r = 0). The caller checks
    s + m <= n and m <= tile rows."""


@overload(kv_rows)
def _kv_rows_impl(rows, s, m, tile):
    if rows.dtype == types.float32:
        return lambda rows, s, m, tile: (rows, s)
    code = _ROW_TYPE.get(rows.dtype)
    if code is None:
        return None

    def decode(rows, s, m, tile):
        for j in range(m):
            family.tile(code, "row", rows, 32, s + j, tile, j)
        return tile, 0
    return decode


def kv_block(rows, s, m, tile):
    """(src, r): rows s .. s + m - 1 of a KV head's cache rows [n, width] as dots16 and
    wsum_rows (dots.py) read them: float32 and f16 rows in place (those kernels convert f16
    bits as they load them, exactly: a decoded tile's values), q8_0 rows decoded into tile
    (kv_rows). The caller checks s + m <= n and m <= tile rows."""


@overload(kv_block)
def _kv_block_impl(rows, s, m, tile):
    if rows.dtype in (types.float32, types.uint16):
        return lambda rows, s, m, tile: (rows, s)
    if rows.dtype in _ROW_TYPE:
        return lambda rows, s, m, tile: kv_rows(rows, s, m, tile)
    return None


def store_kv_row(src, dst, tile):
    """dst [width] (one slot's row of one KV head) = src [Dh] float32 stored as the cache's
    kv_type, bit for bit as encode_rows (kv_cache.py) stores it; tile [>= 1, Dh] float32
    scratch."""


@overload(store_kv_row)
def _store_kv_row_impl(src, dst, tile):
    if dst.dtype == types.float32:
        def copy(src, dst, tile):
            for i in range(dst.shape[0]):
                dst[i] = src[i]
        return copy
    if dst.dtype == types.uint16:
        def store_f16(src, dst, tile):
            x = tile[0:1]
            x[0, :] = src
            encode_f16(x.view(np.uint32), dst.reshape((1, dst.shape[0])))
        return store_f16
    if dst.dtype == types.uint8:
        def store_q8_0(src, dst, tile):
            x = tile[0:1]
            x[0, :] = src
            encode_q8_0(x, dst.reshape((1, dst.shape[0])))
        return store_q8_0
    return None


@kernel(parallel=True)
def decode_f16(bits, out):
    """out [N, D] float32 = the float16 values whose bits are `bits` [N, D] (uint16), exactly,
    through the f16 type's own row tile (the CPU's conversion instruction): numpy's cast
    converts a value at a time, and a prefill chunk over a cached prefix decodes every layer's
    rows, all of them again for each chunk and each slot."""
    N = bits.shape[0]
    for c in prange((N + DECODE_ROWS - 1) // DECODE_ROWS):
        for r in range(c * DECODE_ROWS, min(N, (c + 1) * DECODE_ROWS)):
            family.tile(_F16, "row", bits, 32, r, out, r)
