"""Encoding K/V rows for the cache: float32 -> float16 bits, float32 -> ggml q8_0 blocks.

Bit for bit numpy's float16 conversion (round to nearest even) and quant.py's q8_0
reference (d = amax / 127 in float32, q = roundf(x / d) with halves away from zero, d
stored as float16), in a compiled loop: numpy's versions cost ~20-500 us per call, and
decode calls this twice per layer per token.
"""

import numpy as np

from .jit import kernel


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
