"""The batched decode step's weights, interleaved 16 rows a group so that a token's block
dot products need no horizontal sums: issue 24's 4-row step on the fast path.

The row-group tile of codegen_int8.py (decode's 8x1, the batched step's 8x4c2) dots each
weight row with the token in its own lanes and then reduces the lanes to a sum per row:
per block and token, the pair-sum shuffles cost more than the dot products (q8_0's 4-row
tile keeps 16 float partial sums a row instead: four float operations a block, row and
token). Prefill avoids both with panels packed per call (panel.py), which four tokens do
not pay back. Here the weights are in a layout whose lanes are rows already: q4_0, q4_1,
q5_0, q5_1 and q8_0 matrices in the file's x16 layout (modelfile/layout.py, read in place by the
single step, the batched step and prefill: x16.py), or, for a rows-layout file, a copy the
batched step makes when it is built (`interleave`: the same bytes rearranged):

  wi uint8 [rows / 16, nb * BB]   group g = rows 16g..16g+15; per block of 32 columns BB
                                  bytes: the 16 rows' f16 d, (q4_1) their 16 f16 m, then
                                  q4: 4 chunks of 64 bytes: byte 4l + k of chunk c holds
                                  row l's codes at columns 8c + k (low nibble) and
                                  8c + 4 + k (high nibble), k = 0..3 (layout.py's x16);
                                  q8_0: 16 chunks of 32 bytes: bytes 2l, 2l + 1 of chunk
                                  j are row l's codes at columns 2j, 2j + 1

int8 activations (act_type "int8", llama.cpp's): a q4 chunk's lanes masked to their low
(high) nibbles are, lane l, four u8 codes of row l at columns 8c..8c+3 (8c+4..8c+7), which
one vpdpbusd multiplies by the token's four activations broadcast from memory: 8 a block
and token. int16 activations: the lanes shifted right by 0, 8, 4, 12 bits and masked to
0x000F000F are i16 pairs of row l's codes at columns (8c + k, 8c + k + 2), k = 0, 1, 4, 5;
the tile permutes the token's block of activations within fours (0, 2, 1, 3) in registers
so that those pairs are its words 4c..4c+3, and one vpdpwssd with a word broadcast adds a
pair into each lane: 16 a block and token. Or, on VNNI, the int16 activations q as
halves() (per block 32 bytes lo = q & 255, then 32 bytes hi = q >> 8): a code n (0..15) is a
valid u8 and s8, so sum n q = 256 sum n hi + sum lo n is two vpdpbusd per masked chunk
(codes x hi broadcast from memory, lo broadcast x codes): the same integers as the words'
with no code widened to 16 bits (_halves_dots; tile_acts in x16.py makes them once a
call). Or as pairs() (uint16 [T, K]: each block permuted within fours as PAIR_PERM, made
once a call by x16.prefill_acts): then every pair is a broadcast memory operand, 16
vpdpwssd a block and token and no broadcast in a register. q8_0's int16 chunk j
sign-extended is the pairs (2j, 2j + 1) as stored, against the activations' pair j
broadcast from memory; int8 activations reach it widened to int16 (x16.tile_acts: the
same integers; one layout for both, as the file stores one).
Either way each lane holds its row's block dot product: for q4 the integer the 8x1 tile
reduces to, with the float work per block the 8x1 tile's as it is compiled (_scale), on 16
lanes, with the blocks in group_blocks' two chains: lane by lane the 8x1 tile's operations
in its order, so each row's result is the single step's bit for bit on VNNI
(tests/test_interleave.py). q8_0's block sum is one integer here where the 4x1 tile keeps
16 partial sums in floats: the same products, rounded in another order (a row's result
differs from the single step's by rounding), with no horizontal sums.

q5_0 / q5_1 are q4's tiles on 5-bit codes: each chunk's masked nibbles ORed with their
fifth bits from the rows' permuted high-bit words (_chunk_codes: four operations a chunk
more), the codes (0..31) still valid u8 and s8; only from an x16 file (the single step's
rows tiles for q5 add their floats in another order, so a rows file gets no copies).

  itile_<q4_0|q4_1|q5_0|q5_1|q8_0>_16x<RT>(wi, g, xq, xd, xs, xds, t, out, i)
      out[t + s, i + r] = row 16g + r of W . token t + s, r < 16, s < RT
xq int16 (the default path's: vpdpwssd), its halves() as uint8 [T, 2K] (q4 on VNNI only:
vpdpbusd), its pairs() as uint16 [T, K] (q4) or int8 (q4: vpdpbusd; xs unread) on
AVX-512 VNNI; elsewhere the generic multiply-add IR (vpmaddwd on x86). Callers validate
shapes (step/batched.py builds wi from a matrix the fused step checked): no bounds checks.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types

from ..codegen.int8_tiles import group_blocks
from ..codegen.ir import (
    F32,
    I8,
    I16,
    I32,
    I64,
    ORDERED,
    _c,
    _dot_acc,
    _h2f,
    _i64,
    _llvm_fn,
    _load,
    _pick,
    _prefetch,
    _Rows,
    _splat,
    _typed,
    _v,
    vpdpbusd_bcast,
    vpdpwssd,
    vpdpwssd_bcast,
)
from ..modelfile import layout as layouts
from ..modelfile import quant
from ..runtime.simd import HALF_PUMPED_512, VNNI
from .jit import kernel

__all__ = ["ILV_BLOCK", "ILV_ROWS", "halves", "interleave", "make_itile", "pairs"]

ILV_ROWS = 16  # weight rows of a group: one <16 x i32> lane each
# int16 activations on the q4 byte layout: the shifts of a chunk's lanes whose low nibbles
# (masked to 0x000F000F) are the i16 pairs of columns (8c + k, 8c + k + 2), k = 0, 1, 4, 5
PAIR_SHIFT = (0, 8, 4, 12)
PAIR_PERM = [4 * q + r for q in range(8) for r in (0, 2, 1, 3)]  # a block's activations
# in the pairs' order: word 4c + h = activations 8c + k, 8c + k + 2
_PERM = np.array(PAIR_PERM, np.int64)  # pairs()' table
PF = 2048  # bytes a tile prefetches ahead of its block (measured best from memory
# against 1024 and 4096 for the several-token tiles)
# the q4 one-token tiles' (decode's): they run faster per byte, and from memory 8192 beat
# 2048 and 4096 on one thread, on both activation types (into L1: into L2 was slower); on a
# Zen 4 (HALF_PUMPED_512) none at all: its own prefetchers keep up, and the tiles, bound by
# their instructions there, read 1.1-1.2x faster without the hints (docs/measurements.md)
PF_DECODE = 0 if HALF_PUMPED_512 else 8192
# the layouts this module writes, and bytes of a group's block: the 16 rows' scales (and
# minima), then their codes: the 16 rows' blocks of 32, rearranged
ILV_BLOCK = {n: ILV_ROWS * quant.TYPES[n].block_bytes(32)
             for n in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")}
# where a group's block keeps its code chunks (after the 16 rows' d, m and, q5, high bits)
CODES_AT = {"q4_0": 32, "q4_1": 64, "q5_0": 96, "q5_1": 128}
AFFINE = ("q4_1", "q5_1")  # d q + m; the others d (q - ZERO[kind])
ZERO = {"q4_0": 8, "q5_0": 16}


def interleave(w: np.ndarray, kind: str) -> np.ndarray:
    """ggml q4_0 / q4_1 / q8_0 rows (uint8 [rows, nb * 18 | 20 | 34], rows a multiple of
    16) -> the interleaved groups (uint8 [rows / 16, nb * ILV_BLOCK[kind]]): the file's
    x16 layout (layout.to_x16), whatever the activations."""
    return layouts.to_x16(w, kind)


def _scale(b, kind, AB, tot, drow, srow, foff, dw, mw, acc):
    """acc + one block's <16 x i32> dot products `tot` as floats, in the operations the
    8x1 tile's scale_block compiles to. scale_block is written with fast-math flags, and
    LLVM reassociates it differently per codegen: read from the 8x1 tiles' assembly
    (tests/test_interleave.py holds the results to them), per activation type AB (bytes)
      q4_0          f = fma(tot, dx, -8 xds); acc = fma(f, dw, acc)   (the order written)
      q4_1, int8    acc = fma(tot dw, dx, acc); acc = fma(mw, xds, acc)
      q4_1, int16   acc = fma(mw, xds, acc); acc = fma(tot, dx dw, acc)
      q8_0          acc = fma(tot, dw dx, acc)   (its own: see the module docstring)
    Written here as explicit fused multiply-adds, so nothing reorders them (off VNNI,
    where no single step's tile is matched, as ordered multiplies and adds)."""
    L = tot.type.count
    vf = _v(F32, L)
    if VNNI:
        fn = _llvm_fn(b, f"llvm.fma.v{L}f32", vf, [vf] * 3)

        def fma(args):
            return b.call(fn, args)
    else:
        def fma(args):
            return b.fadd(b.fmul(args[0], args[1], flags=ORDERED), args[2], flags=ORDERED)
    ft = b.sitofp(tot, vf)
    dx = _splat(b, _load(b, drow, foff, F32), L)
    ds = _splat(b, _load(b, srow, foff, F32), L)
    if kind == "q8_0":
        return fma([ft, b.fmul(dw, dx, flags=ORDERED), acc])
    if kind in ZERO:  # q4_0, q5_0
        f = fma([ft, dx, b.fmul(ds, _c(vf, [-float(ZERO[kind])] * L), flags=ORDERED)])
        return fma([f, dw, acc])
    if AB == 1:
        acc = fma([b.fmul(ft, dw, flags=ORDERED), dx, acc])
        return fma([mw, ds, acc])
    acc = fma([mw, ds, acc])
    return fma([ft, b.fmul(dx, dw, flags=ORDERED), acc])


def _itile_codegen(kind, RT):
    """Codegen of itile_<kind>_16x<RT> (module docstring)."""
    BB = ILV_BLOCK[kind]
    L = ILV_ROWS
    v16i, v32w = _v(I32, L), _v(I16, 2 * L)
    chains = 2 if RT > 1 else 4  # integer chains a token (any split: the same sums)
    # q8_0's one-token tile: as q4's where none (Zen 4), else PF: at 8192 it read 0.7x the
    # rows tile's rate under EDGELLM_ISA=avx2 on a Zen 4 (docs/measurements.md)
    pf = PF if RT > 1 or (kind == "q8_0" and PF_DECODE) else PF_DECODE

    def codegen(ctx, b, sig, args):
        w, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 5, 7))
        g, t, i = args[1], args[6], args[8]
        halves = sig.args[2].dtype == types.uint8  # int16 activations as halves()
        paired = sig.args[2].dtype == types.uint16  # int16 activations as pairs()
        AB = 2 if halves or paired or sig.args[2].dtype == types.int16 else 1
        wrow = w.row(g)
        toks = [b.add(t, _i64(s)) for s in range(RT)]
        xrows, drows, srows = ([a.row(u) for u in toks] for a in (xq, xd, xds))
        zero = _c(v16i, [0] * L)

        def dot(acc, wv, xv):
            if VNNI:
                return vpdpwssd(b, acc, wv, xv)
            v32 = _v(I32, 2 * L)  # vpmaddwd: i16 pairs multiplied and summed into i32
            prod = b.mul(b.sext(b.bitcast(wv, v32w), v32), b.sext(b.bitcast(xv, v32w), v32))
            return b.add(acc, b.add(_pick(b, prod, range(0, 2 * L, 2)),
                                    _pick(b, prod, range(1, 2 * L, 2))))

        def pair(xrow, xoff, j):
            """The token's int16 activations 2j, 2j + 1 of the block as an i32, every lane."""
            return _splat(b, _load(b, xrow, b.add(xoff, _i64(4 * j)), I32), L)

        def body(bi, st):
            p = b.gep(wrow, [b.mul(bi, _i64(BB))], inbounds=True)
            for c in range(0, BB, 64):  # the stream PF bytes ahead (a hint: may pass the end)
                if pf:
                    _prefetch(b, b.gep(p, [_i64(pf + c)]))
            dw = _h2f(b, _load(b, p, 0, _v(I16, L)))
            mw = _h2f(b, _load(b, p, 32, _v(I16, L))) if kind in AFFINE else None
            xoff, foff = b.mul(bi, _i64(32 * AB)), b.mul(bi, _i64(4))
            acc = [[zero] * chains for _ in range(RT)]
            if halves:
                return [_scale(b, kind, AB, tot, drows[s], srows[s], foff, dw, mw, st[s])
                        for s, tot in enumerate(_halves_dots(b, p, kind, xrows, xoff, RT))]
            at = [b.ptrtoint(b.gep(x, [xoff], inbounds=True), I64) for x in xrows]
            if VNNI and AB == 2:  # the pairs as broadcast memory operands of vpdpwssd

                def step(s, k, wv, j):
                    acc[s][k] = vpdpwssd_bcast(b, acc[s][k], wv, at[s], 4 * j)
            else:
                def step(s, k, wv, j):
                    acc[s][k] = dot(acc[s][k], wv, pair(xrows[s], xoff, j))

            def quad(s, k, wv, disp):
                """acc + wv's u8 quadruples . the token's int8 activations disp..disp + 3."""
                if VNNI:
                    acc[s][k] = vpdpbusd_bcast(b, acc[s][k], wv, at[s], disp)
                else:
                    x4 = _splat(b, _load(b, xrows[s], b.add(xoff, _i64(disp)), I32), L)
                    acc[s][k] = _dot_acc(b, acc[s][k], b.bitcast(wv, _v(I8, 4 * L)),
                                         b.bitcast(x4, _v(I8, 4 * L)))
            if kind == "q8_0":  # int16 activations only (int8 ones widened: x16.tile_acts)
                for j in range(16):
                    wv = b.bitcast(b.sext(_load(b, p, 32 + 32 * j, _v(I8, 2 * L)), v32w), v16i)
                    for s in range(RT):
                        step(s, j % chains, wv, j)
            if kind != "q8_0" and AB == 1:  # byte layout: quadruples, vpdpbusd
                for c in range(4):
                    for h, wv in enumerate(_chunk_codes(b, p, kind, c)):
                        for s in range(RT):  # lane l: row l's columns 8c + 4h + k, k < 4
                            quad(s, (2 * c + h) % chains, wv, 8 * c + 4 * h)
            if kind != "q8_0" and AB == 2:  # byte layout as i16 pairs, vpdpwssd
                # pair word 4c + h of the token's block permuted within fours (0, 2, 1, 3):
                # its activations 8c + k, 8c + k + 2 (k = PAIR_COLS[h]), which the chunk's
                # lanes shifted right by PAIR_SHIFT[h] and masked to 0x000F000F meet; as
                # pairs() they are in that order in memory (broadcast operands), else
                # permuted here in registers
                pw = None if paired else [
                    b.bitcast(b.shuffle_vector(_load(b, xr, xoff, _v(I16, 32)),
                                               ir.Constant(_v(I16, 32), ir.Undefined),
                                               _c(_v(I32, 32), PAIR_PERM)), v16i)
                    for xr in xrows]
                for c in range(4):
                    for h, wv in enumerate(_chunk_pairs(b, p, kind, c)):
                        j = 4 * c + h
                        for s in range(RT):
                            if paired:
                                step(s, j % chains, wv, j)
                                continue
                            xv = _splat(b, b.extract_element(pw[s], _c(I32, j)), L)
                            acc[s][j % chains] = dot(acc[s][j % chains], wv, xv)
            new = []
            for s in range(RT):
                tot = acc[s][0]
                for a in acc[s][1:]:
                    tot = b.add(tot, a)
                new.append(_scale(b, kind, AB, tot, drows[s], srows[s], foff, dw, mw, st[s]))
            return new

        nblocks = b.sdiv(xq.cols, _i64(64 if halves else 32))
        group_blocks(b, nblocks, RT, body, out, t, i, range(L), chains=2)
        return ctx.get_dummy_value()

    return codegen


def _chunk_codes(b, p, kind, c):
    """Chunk c of a q4 / q5 group's block at p as two <16 x i32>, lane l four u8 codes of
    row l: columns 8c..8c + 3 (the low nibbles), 8c + 4..8c + 7 (the high ones); q5's fifth
    bits ORed in from the rows' permuted high-bit words (layout.QH_PERM)."""
    v16i = _v(I32, ILV_ROWS)

    def k(n):
        return _c(v16i, [n] * ILV_ROWS)
    v = _load(b, p, CODES_AT[kind] + 64 * c, v16i)
    lo, hi = b.and_(v, k(0x0F0F0F0F)), b.and_(b.lshr(v, k(4)), k(0x0F0F0F0F))
    if kind in ("q5_0", "q5_1"):
        qh = _load(b, p, CODES_AT[kind] - 64, v16i)
        lo = b.or_(lo, b.and_(b.shl(qh, k(4 - c)), k(0x10101010)))
        hi = b.or_(hi, b.and_(b.lshr(qh, k(c)) if c else qh, k(0x10101010)))
    return lo, hi


def _chunk_pairs(b, p, kind, c):
    """Chunk c's codes as four <16 x i32> of i16 pairs, lane l row l's codes at columns
    (8c + k, 8c + k + 2), k = 0, 1, 4, 5 (PAIR_SHIFT's order): q4's lanes shifted and
    masked to 0x000F000F, q5's from _chunk_codes' bytes."""
    v16i = _v(I32, ILV_ROWS)

    def k(n):
        return _c(v16i, [n] * ILV_ROWS)
    if kind in ("q4_0", "q4_1"):
        v = _load(b, p, CODES_AT[kind] + 64 * c, v16i)
        return [b.and_(b.lshr(v, k(sh)) if sh else v, k(0x000F000F)) for sh in PAIR_SHIFT]
    out = []
    for u in _chunk_codes(b, p, kind, c):
        out += [b.and_(u, k(0x00FF00FF)), b.and_(b.lshr(u, k(8)), k(0x00FF00FF))]
    return out


def _halves_dots(b, p, kind, xrows, xoff, RT):
    """The <16 x i32> block dot products (a lane a row) of a q4 / q5 group's block at p
    with RT tokens' int16 activations q given as halves() bytes at xoff of xrows: sum n q =
    256 sum n hi + sum lo n, with hi = q >> 8 (s8) and lo = q & 255 (u8), both on vpdpbusd
    (u8 x s8): a code n (0..31) is either. Per chunk, its lanes masked to
    their low (high) nibbles are four u8 codes of columns 8c + 4h + k, k < 4: against the
    four hi bytes broadcast from memory ({1to16}), and as s8 against the four lo bytes
    broadcast to a register (the u8 operand cannot be the broadcast one). Exact integers:
    |sum n hi| <= 32 * 31 * 128, so the shift cannot overflow."""
    v16i = _v(I32, ILV_ROWS)
    zero = _c(v16i, [0] * ILV_ROWS)
    dpb = _llvm_fn(b, "llvm.x86.avx512.vpdpbusd.512", v16i, [v16i] * 3)
    n_chains = 2  # chains of each half a token (RT = 4: 16 accumulators; 1 a half was
    # 5-8% slower: tile_bound.py --prefill)
    hi = [[zero] * n_chains for _ in range(RT)]
    lo = [[zero] * n_chains for _ in range(RT)]
    for c in range(4):
        for h, wv in enumerate(_chunk_codes(b, p, kind, c)):
            # lane l: row l's codes at columns 8c + 4h + k, k < 4
            col, k = 8 * c + 4 * h, (2 * c + h) % n_chains
            for s in range(RT):
                xh = _splat(b, _load(b, xrows[s], b.add(xoff, _i64(32 + col)), I32), ILV_ROWS)
                hi[s][k] = b.call(dpb, [hi[s][k], wv, xh])
                xl = _splat(b, _load(b, xrows[s], b.add(xoff, _i64(col)), I32), ILV_ROWS)
                lo[s][k] = b.call(dpb, [lo[s][k], xl, wv])
    tots = []
    for s in range(RT):
        h, l = hi[s][0], lo[s][0]
        for k in range(1, n_chains):
            h, l = b.add(h, hi[s][k]), b.add(l, lo[s][k])
        tots.append(b.add(b.shl(h, _c(v16i, [8] * ILV_ROWS)), l))
    return tots


@kernel
def pairs(xq, xp):
    """int16 activations xq [T, K] (K % 32 == 0) -> xp uint16 [T, K] (the int16 bits), the
    q4 tiles' other form of them: each block of 32 permuted within fours (PAIR_PERM), so
    that its i32 word j is the pair of activations the chunks' lanes shifted by
    PAIR_SHIFT[j % 4] meet, read as a broadcast memory operand of vpdpwssd. Once per token
    and matrix: every group reads it."""
    for t in range(xq.shape[0]):
        for bi in range(xq.shape[1] // 32):
            for m in range(32):
                xp[t, 32 * bi + m] = np.uint16(xq[t, 32 * bi + _PERM[m]])



@kernel
def halves(xq, xh):
    """int16 activations xq [T, K] (K % 32 == 0) -> xh uint8 [T, 2K], the tiles' form of
    them on VNNI: per block of 32, its 32 low bytes (q & 255), then its 32 high bytes
    (q >> 8, an int8's bits). Once per token and matrix: every group reads it."""
    for t in range(xq.shape[0]):
        for bi in range(xq.shape[1] // 32):
            for j in range(32):
                q = np.int32(xq[t, 32 * bi + j])
                xh[t, 64 * bi + j] = np.uint8(q & 255)
                xh[t, 64 * bi + 32 + j] = np.uint8((q >> 8) & 255)


def make_itile(kind, RT):
    """The intrinsic itile_<kind>_16x<RT> (tiles.py)."""
    acts = (types.int16,)  # q8_0's (x16.tile_acts widens int8 activations for it)
    if kind != "q8_0":  # q4: int8, pairs() anywhere, halves() on VNNI
        acts += (types.int8, types.uint16) + ((types.uint8,) if VNNI else ())
    arrays = {0: types.uint8, 2: acts, 3: types.float32,
              4: types.int32, 5: types.float32, 7: types.float32}
    return _typed(f"itile_{kind}_16x{RT}", _itile_codegen(kind, RT), arrays, ints=(1, 6, 8))
