"""Kernels on matrices stored in the x16 layout (modelfile/layout.py: 16 rows a group, one
row a lane): the batched step's interleaved tiles (interleave.py, "i1" "i2" "i4" of the
type's recipe) read the file's bytes in place, for decode, the batched step and prefill.

    make_x16(code) -> {  (each role prefixed "x16_" in KERNELS[code]: registry.py)
      "mv_rows"(wi, xq, xd, xs, xds, out, r0, r1)   integer activations, rows r0..r1-1
                                                    (multiples of 16), serial: one "i1"
                                                    tile a group
      "mv"(wi, xq, xd, xs, xds, out)                the same, groups split between threads
      "mm"(wi, xq, xd, xs, xds, out, T)             prefill: each group meets the T tokens
                                                    four, two, then one at a time
      "mvp_rows"(wi, x, out, r0, r1), "mvp"(wi, x, out), "mmp"(wi, x, out)
                                                    float activations ("precise"): each
                                                    row's blocks dequantized as it goes
      "embed"(wi, ids, out)                         rows ids dequantized
    }
wi is the tensor's data, uint8 [rows / 16, 16 * row_bytes]; out[t, r] as linear.py's. On
AVX-512 VNNI prefill's int16 activations reach the tiles as interleave.pairs() (prefill_acts:
made once a call, shared by every group), the batched step's as halves() (tile_acts; decode's
where DECODE_HALVES); off VNNI on x86 prefill's as pairs() too (PAIRS_OFF_VNNI). Each
row's integer-activation result is the same whichever tile ("i1", "i2", "i4") had it
(interleave.py), so prefill, decode and the batched step agree bit for bit. The float
kernels sum each row's products in column order (not the rows layout's tile order: equal
within float rounding). Callers validate shapes (linear.py, step/fused.py): no bounds checks.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import overload

from ..modelfile import quant
from ..runtime.simd import HALF_PUMPED_512, VNNI, X86
from .family import kern, name_of, tile
from .interleave import AFFINE, ZERO, halves, pairs
from .jit import GLUE, kernel
from .kquant import F16
from .matvec import named

ROWS = 16  # rows a group (layout.GROUP_ROWS)
# the types whose tiles take int16 activations as halves()
HALVES = ("q4_0", "q4_1", "q5_0", "q5_1")
# Decode's matvec (one token) on halves: from L3 1.4-1.9x the int16 words' speed; from
# memory it depends on the core. Where 512-bit instructions issue whole (Zen 5; 1.7B shapes,
# a loaded host, benchmarks/tile_bound.py --matvec) halves were 3-8% slower, decode being
# bound by memory there: words. Where they issue as two halves (Zen 4, HALF_PUMPED_512) the
# words tile is bound by its instructions at ~20 GB/s even from L3, and halves read a
# model's matrices in step order 1.06-1.19x faster on one thread and 1.03-1.14x on two
# (with no prefetch hints there: interleave.PF_DECODE; docs/measurements.md).
# The tiles of 2 and 4 tokens are bound by their instructions: the batched step's on halves,
# prefill's (four tokens a tile) on pairs, whose every activation pair is a broadcast memory
# operand (as fast as halves on a quiet core, 0.8x the time where the core is contended; on
# the 2-token tiles 1.05-1.09x halves' time: docs/design-figures.md).
DECODE_HALVES = HALF_PUMPED_512
# Off VNNI (AVX2, and the generic path on any x86 CPU) the words are permuted in registers
# for every pair, on the shuffle port the tiles run short of: prefill's pairs(), each pair a
# broadcast load, made once a call for all its tokens, measured faster there. Decode and the
# batched step keep the words: made per matrix call inside the step, the conversion cost
# more than the tiles gained (docs/measurements.md). aarch64 keeps the words: untimed.
PAIRS_OFF_VNNI = X86


def tile_acts(code, xq):
    """The integer activations xq [T, K] as type `code`'s "i" tiles of the batched step
    read them fastest: for q4_0 / q4_1, int16 ones on AVX-512 VNNI as interleave.halves()
    (a new uint8 [T, 2K], made once for all the matrix's groups: vpdpbusd on bytes where the
    int16 words take vpdpwssd on codes widened to 16 bits), else xq itself. The same
    integer dot products, so the same results bit for bit. code: a compile-time constant."""
    raise NotImplementedError("tile_acts runs in kernels only")


def prefill_acts(code, xq):
    """tile_acts for prefill's four-token tiles: q4_0 / q4_1 int16 activations on AVX-512
    VNNI, and off VNNI on x86 (PAIRS_OFF_VNNI), as interleave.pairs() (a new uint16 [T, K]),
    else xq itself."""
    raise NotImplementedError("prefill_acts runs in kernels only")


def decode_acts(code, xq):
    """tile_acts for decode's one-token tiles where DECODE_HALVES, else xq itself."""
    raise NotImplementedError("decode_acts runs in kernels only")


def _acts(code, xq, form):
    name = name_of(code.literal_value) if isinstance(code, types.IntegerLiteral) else ""
    if name == "q8_0" and xq.dtype == types.int8:  # its tiles read int16 pairs only
        def widen(code, xq):
            return xq.astype(np.int16)
        return widen
    q4 = name in HALVES
    usable = {"halves": VNNI, "pairs": VNNI or PAIRS_OFF_VNNI}
    if not (usable.get(form, False) and q4 and xq.dtype == types.int16):
        return lambda code, xq: xq
    if form == "halves":
        def impl(code, xq):
            xh = np.empty((xq.shape[0], 2 * xq.shape[1]), np.uint8)
            halves(xq, xh)
            return xh
        return impl

    def impl(code, xq):  # "pairs"
        xp = np.empty(xq.shape, np.uint16)
        pairs(xq, xp)
        return xp
    return impl


@overload(tile_acts, jit_options=GLUE, prefer_literal=True)
def _tile_acts(code, xq):
    return _acts(code, xq, "halves")


@overload(prefill_acts, jit_options=GLUE, prefer_literal=True)
def _prefill_acts(code, xq):
    return _acts(code, xq, "pairs")


@overload(decode_acts, jit_options=GLUE, prefer_literal=True)
def _decode_acts(code, xq):
    return _acts(code, xq, "halves" if DECODE_HALVES else None)


@kernel
def _dequant_block(wi, g, l, base, hdr, zero, affine, q5, vals):
    """Row l of group g's block at byte base -> vals [32] float32: d (q - zero), or d q + m;
    q5: the codes' fifth bits from the row's permuted high-bit word (layout.QH_PERM)."""
    o = base + 2 * l
    d = F16[np.int32(wi[g, o]) | (np.int32(wi[g, o + 1]) << 8)]
    m = np.float32(0.0)
    if affine:
        o = base + 32 + 2 * l
        m = F16[np.int32(wi[g, o]) | (np.int32(wi[g, o + 1]) << 8)]
    q0 = base + 16 * hdr + 4 * l
    qh = np.int64(0)
    if q5:
        for k in range(4):
            qh |= np.int64(wi[g, q0 + k]) << (8 * k)
        q0 += 64
    for c in range(4):
        for k in range(4):
            byte = np.int32(wi[g, q0 + 64 * c + k])
            lo = (byte & 15) | np.int32(((qh >> (8 * k + c)) & 1) << 4)
            hi = (byte >> 4) | np.int32(((qh >> (8 * k + 4 + c)) & 1) << 4)
            lo, hi = lo - zero, hi - zero
            vals[8 * c + k] = d * np.float32(lo) + m
            vals[8 * c + 4 + k] = d * np.float32(hi) + m


@kernel
def _dequant_block_q8(wi, g, l, base, vals):
    """Row l of group g's q8_0 block at byte base -> vals [32] float32: d q, the codes of
    columns 2j, 2j + 1 at bytes 2l, 2l + 1 of chunk j (layout.py)."""
    d = F16[np.int32(wi[g, base + 2 * l]) | (np.int32(wi[g, base + 2 * l + 1]) << 8)]
    for j in range(16):
        for e in range(2):
            vals[2 * j + e] = d * np.float32(np.int8(wi[g, base + 32 + 32 * j + 2 * l + e]))


@kernel
def _block_values(wi, g, l, base, hdr, zero, affine, q5, q8, vals):
    """Row l of group g's block at byte base -> vals [32] float32, of any x16 type of blocks
    of 32 (the flags: make_x16's)."""
    if q8:
        _dequant_block_q8(wi, g, l, base, vals)
    else:
        _dequant_block(wi, g, l, base, hdr, zero, affine, q5, vals)


def make_x16(code: int) -> dict:
    """Type `code`'s x16 kernels (the module docstring), each closing over the code alone."""
    name = name_of(code)
    t = quant.TYPES[name]
    hdr, BB = t.header_bytes, t.block_bytes(32)
    GB = ROWS * BB  # bytes of a group's block
    zero = ZERO.get(name, 0)
    affine = name in AFFINE
    q5 = name in ("q5_0", "q5_1")
    q8 = name == "q8_0"

    @kernel
    @named(f"mv_rows_x16_{name}")
    def mv_rows(wi, xq, xd, xs, xds, out, r0, r1):
        xa = decode_acts(code, xq)
        for g in range(r0 // ROWS, r1 // ROWS):
            tile(code, "i1", wi, g, xa, xd, xs, xds, 0, out, g * ROWS)

    @kernel(parallel=True)
    @named(f"mv_x16_{name}")
    def mv(wi, xq, xd, xs, xds, out):
        xa = decode_acts(code, xq)
        for g in prange(wi.shape[0]):
            tile(code, "i1", wi, g, xa, xd, xs, xds, 0, out, g * ROWS)

    @kernel
    @named(f"tokens_x16_{name}")
    def tokens(wi, g, xq, xd, xs, xds, out, T):
        """out[:T, 16g:16g + 16]: four, two, then one token a tile."""
        t = 0
        while t + 4 <= T:
            tile(code, "i4", wi, g, xq, xd, xs, xds, t, out, g * ROWS)
            t += 4
        if t + 2 <= T:
            tile(code, "i2", wi, g, xq, xd, xs, xds, t, out, g * ROWS)
            t += 2
        if t < T:
            tile(code, "i1", wi, g, xq, xd, xs, xds, t, out, g * ROWS)

    @kernel(parallel=True)
    @named(f"mm_x16_{name}")
    def mm(wi, xq, xd, xs, xds, out, T):
        xa = prefill_acts(code, xq[:T])
        for g in prange(wi.shape[0]):
            kern(code, "x16_tokens", wi, g, xa, xd, xs, xds, out, T)

    @kernel
    @named(f"dot_rows_x16_{name}")
    def dot_rows(wi, x, out, t, r0, r1, vals):
        """out[t, r] = row r . x[t] for r in r0..r1-1, blocks dequantized into vals [32]."""
        nb = x.shape[1] // 32
        for r in range(r0, r1):
            g, lane = r // ROWS, r % ROWS
            acc = np.float32(0.0)
            for bi in range(nb):
                _block_values(wi, g, lane, bi * GB, hdr, zero, affine, q5, q8, vals)
                s = np.float32(0.0)
                for j in range(32):
                    s += vals[j] * x[t, 32 * bi + j]
                acc += s
            out[t, r] = acc

    @kernel
    @named(f"mvp_rows_x16_{name}")
    def mvp_rows(wi, x, out, r0, r1):
        kern(code, "x16_dot_rows", wi, x, out, 0, r0, r1, np.empty(32, np.float32))

    @kernel(parallel=True)
    @named(f"mvp_x16_{name}")
    def mvp(wi, x, out):
        for g in prange(wi.shape[0]):
            kern(code, "x16_dot_rows", wi, x, out, 0, g * ROWS, g * ROWS + ROWS,
                 np.empty(32, np.float32))

    @kernel(parallel=True)
    @named(f"mmp_x16_{name}")
    def mmp(wi, x, out):
        for g in prange(wi.shape[0]):
            vals = np.empty(32, np.float32)
            for t in range(x.shape[0]):
                kern(code, "x16_dot_rows", wi, x, out, t, g * ROWS, g * ROWS + ROWS, vals)

    @kernel
    @named(f"embed_x16_{name}")
    def embed(wi, ids, out):
        nb = out.shape[1] // 32
        for t in range(ids.shape[0]):
            g, lane = ids[t] // ROWS, ids[t] % ROWS
            for bi in range(nb):
                _block_values(wi, g, lane, bi * GB, hdr, zero, affine, q5, q8,
                              out[t, 32 * bi:32 * bi + 32])

    return {"x16_" + k: f for k, f in dict(
        mv_rows=mv_rows, mv=mv, mm=mm, mvp_rows=mvp_rows, mvp=mvp, mmp=mmp, embed=embed,
        tokens=tokens, dot_rows=dot_rows).items()}
