"""Kernels on q4_k matrices stored in the x16 layout (modelfile/layout.py: 16 rows a group,
one row a <16 x i32> lane): a super-block's dot products need no horizontal sums, and its
scales, minima and float work are done once for 16 rows (llama.cpp repacks Q4_K at load for
the same reason: its q4_K_8x8 GEMV).

    KERNELS_X16_K (registry.py prefixes each role "x16_" in KERNELS[q4_k's code])
      "mv_rows_sb"(wi, xq, xd, xb, out, r0, r1)   act_quant_k's super-block activations
                                                  (ActK), rows r0..r1-1 (multiples of 16)
      "mv_sb"(wi, xq, xd, xb, out)                the same, groups split between threads
      "mm_sb"(wi, xq, xd, xb, out, T)             prefill: each group meets the T tokens
                                                  four, then one at a time
      "mvp_rows"(wi, x, out, r0, r1), "mvp"(wi, x, out), "mmp"(wi, x, out)
                                                  float activations: each group's
                                                  super-blocks dequantized as it goes
      "embed"(wi, ids, out)                       rows ids dequantized
wi uint8 [rows / 16, nsb * 2304]; out[t, r] as linear.py's. Callers validate shapes.

The tile (ktile16_q4_k_16x<RT>): per chunk of 64 bytes (lane l: four code bytes of row l),
its lanes masked to low (high) nibbles are four u8 codes of each row. On AVX-512 VNNI with
int16 activations (act_quant_k.SPLIT: a super-block's low bytes lo, then its high bytes hi,
x = 256 hi + lo) one vpdpbusd multiplies them by the token's four hi bytes broadcast and one
more the lo bytes (the u8 operand) by the codes as s8 (a code 0..15 is either), as x16.py's
halves on q4_0; int8 activations one vpdpbusd. Elsewhere (AVX2, aarch64) the lanes shifted
by 4h + 8q and masked to 0x000F000F are i16 pairs of codes at columns (col + q, col + q + 2)
against the activation pair broadcast (adjacent where act_quant_k.DEINT stores each block's
even values, then its odd ones): vpmaddwd. A block's dot T_j is exact in i32 and in f32
(|T_j| <= 32 x 15 x 32767 < 2^24); times its 6-bit scale it is summed in float (eight blocks
of a row could pass 2^31 in integers), the minima's sum_j m_j xsum_j in integers, then
d dx and dmin dx per super-block, all as explicit fused multiply-adds: every tile's results
(1 and 4 tokens) are the same bit for bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types

from ..codegen import ir as irh
from ..codegen.ir import (
    F32,
    FAST,
    I8,
    I16,
    I32,
    ORDERED,
    _c,
    _h2f,
    _i64,
    _load,
    _pick,
    _Rows,
    _splat,
    _store_vec,
    _typed,
    _v,
)
from ..codegen.kquant_k_tiles import DEINT
from ..runtime.simd import VNNI
from .act_quant_k import SPLIT
from .jit import kernel
from .kquant import F16
from .panel16 import BLOCK16, Q4_K, SCALES16, _tokens16

__all__ = ["KERNELS_X16_K", "SB_BYTES"]

ROWS = 16
SB_BYTES = ROWS * 144  # a group's super-block (layout.py)
CHAINS = 2  # accumulator chains a block half (their sum is the same integer)


def _scales_16(b, p):
    """The 16 rows' 6-bit scales and minima of the group's super-block at p: two lists of
    8 <16 x i32> (block j's, a lane a row), ggml's get_scale_min_k4 on byte vectors."""
    v = _v(I8, ROWS)
    by = [_load(b, p, 64 + 16 * k, v) for k in range(12)]

    def k(n):
        return _c(v, [n] * ROWS)
    sc, mn = [], []
    for j in range(8):
        if j < 4:
            s, m = b.and_(by[j], k(63)), b.and_(by[j + 4], k(63))
        else:
            s = b.or_(b.and_(by[j + 4], k(15)), b.shl(b.lshr(by[j - 4], k(6)), k(4)))
            m = b.or_(b.lshr(by[j + 4], k(4)), b.shl(b.lshr(by[j], k(6)), k(4)))
        sc.append(b.zext(s, _v(I32, ROWS)))
        mn.append(b.zext(m, _v(I32, ROWS)))
    return sc, mn


def _k16_codegen(RT):
    """ktile16_q4_k_16x<RT>(wi, g, xq, xd, xb, t, out, i): out[t + s, i + r] = row 16g + r
    of W . token t + s, r < 16, s < RT; xq ActK's int16 or int8 (SPLIT, DEINT or in order,
    as act_quant_k stores them), xd [T, K/256], xb [T, K/16]."""
    v16i, v16f, v32w = _v(I32, ROWS), _v(F32, ROWS), _v(I16, 2 * ROWS)

    def codegen(ctx, b, sig, args):
        w, xq, xd, xb, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
        g, t, i = args[1], args[5], args[7]
        A = I16 if sig.args[2].dtype == types.int16 else I8
        AB = A.width // 8
        mode = ("split" if SPLIT and A == I16 else "busd" if VNNI else "pairs")
        wrow = w.row(g)
        toks = [b.add(t, _i64(s)) for s in range(RT)]
        xrows, drows, brows = ([a.row(u) for u in toks] for a in (xq, xd, xb))
        dpb = (irh._llvm_fn(b, "llvm.x86.avx512.vpdpbusd.512", v16i, [v16i] * 3)
               if VNNI else None)
        zero = _c(v16i, [0] * ROWS)
        nib = _c(v16i, [0x0F0F0F0F] * ROWS)
        pair_mask = _c(v16i, [0x000F000F] * ROWS)

        if VNNI:  # explicit fused multiply-adds: the same float operations in every tile
            fma_fn = irh._llvm_fn(b, "llvm.fma.v16f32", v16f, [v16f] * 3)

            def fma(x, y, z):
                return b.call(fma_fn, [x, y, z])
        else:
            def fma(x, y, z):
                return b.fadd(b.fmul(x, y, flags=ORDERED), z, flags=ORDERED)

        def k32(n):
            return _c(v16i, [n] * ROWS)

        def bcast4(s, off):
            """The four bytes at byte off of token s's row, in every lane (<16 x i32>)."""
            return _splat(b, _load(b, xrows[s], off, I32), ROWS)

        def xpair(s, x0, col, q):
            """Token s's activations col + q, col + q + 2 as an i16 pair in every lane."""
            blk, cb = divmod(col, 32)
            if DEINT:  # adjacent: both even (q = 0) or both odd
                e = 32 * blk + 16 * q + cb // 2
                two = _load(b, xrows[s], b.add(x0, _i64(AB * e)), _v(A, 2))
            else:
                lo, hi = (_load(b, xrows[s], b.add(x0, _i64(AB * (col + q + d))), A)
                          for d in (0, 2))
                two = b.insert_element(b.insert_element(ir.Constant(_v(A, 2), ir.Undefined),
                                                        lo, _c(I32, 0)), hi, _c(I32, 1))
            if A == I8:
                two = b.sext(two, _v(I16, 2))
            return b.bitcast(_splat(b, b.bitcast(two, I32), ROWS), v32w)

        def block_dots(p, x0, c):
            """tots[s][h]: <16 x i32> block 2c + h's dot products of token s, a lane a row."""
            n = CHAINS if mode == "split" else 1
            hi = [[[zero] * n for _ in range(2)] for _ in range(RT)]
            lo = [[[zero] * n for _ in range(2)] for _ in range(RT)]
            for m in range(8):
                v = _load(b, p, 256 + 64 * (8 * c + m), v16i)
                for h in range(2):
                    col, k = 64 * c + 32 * h + 4 * m, m % n
                    if mode == "pairs":  # lanes >> (4h + 8q) & 0x000F000F: i16 pairs of
                        # the codes at columns col + q, col + q + 2
                        for q in range(2):
                            sh = 4 * h + 8 * q
                            wv = b.bitcast(b.and_(b.lshr(v, k32(sh)) if sh else v, pair_mask),
                                           v32w)
                            for s in range(RT):
                                d = irh._pair_dot(b, wv, xpair(s, x0, col, q))
                                lo[s][h][k] = b.add(lo[s][h][k], d)
                        continue
                    wv = b.and_(b.lshr(v, k32(4)) if h else v, nib)
                    for s in range(RT):
                        if mode == "busd":
                            lo[s][h][k] = b.call(dpb, [lo[s][h][k], wv,
                                                       bcast4(s, b.add(x0, _i64(col)))])
                            continue
                        xh = bcast4(s, b.add(x0, _i64(256 + col)))
                        hi[s][h][k] = b.call(dpb, [hi[s][h][k], wv, xh])
                        lo[s][h][k] = b.call(dpb, [lo[s][h][k], bcast4(s, b.add(x0, _i64(col))),
                                                   wv])
            tots = []
            for s in range(RT):
                row = []
                for h in range(2):
                    H, L = hi[s][h][0], lo[s][h][0]
                    for k in range(1, n):
                        H, L = b.add(H, hi[s][h][k]), b.add(L, lo[s][h][k])
                    row.append(b.add(b.shl(H, k32(8)), L) if mode == "split" else L)
                tots.append(row)
            return tots

        def body(sb, st):
            p = b.gep(wrow, [b.mul(sb, _i64(SB_BYTES))], inbounds=True)
            x0 = b.mul(sb, _i64(256 * AB))
            sc, mn = _scales_16(b, p)
            scf = [b.uitofp(s, v16f) for s in sc]
            dd = _h2f(b, _load(b, p, 0, _v(I16, ROWS)))
            dm = _h2f(b, _load(b, p, 32, _v(I16, ROWS)))
            sums = [None] * RT  # each token's sum_j sc_j T_j (float)
            for c in range(4):
                for s, row in enumerate(block_dots(p, x0, c)):
                    for h, tot in enumerate(row):
                        tf, f = b.sitofp(tot, v16f), scf[2 * c + h]
                        sums[s] = (b.fmul(tf, f, flags=ORDERED) if sums[s] is None else
                                   fma(tf, f, sums[s]))
            new = list(st)
            for s in range(RT):
                xs = _load(b, brows[s], b.mul(sb, _i64(64)), v16i)  # sums per 16
                xs8 = b.add(_pick(b, xs, range(0, 16, 2)), _pick(b, xs, range(1, 16, 2)))
                msum = None
                for j in range(8):
                    term = b.mul(mn[j], _pick(b, xs8, [j] * ROWS))
                    msum = term if msum is None else b.add(msum, term)
                dx = _splat(b, _load(b, drows[s], b.mul(sb, _i64(4)), F32), ROWS)
                new[s] = fma(sums[s], b.fmul(dd, dx, flags=ORDERED), new[s])
                new[RT + s] = fma(b.sitofp(msum, v16f), b.fmul(dm, dx, flags=ORDERED),
                                  new[RT + s])
            return new

        init = [_c(v16f, [0.0] * ROWS)] * (2 * RT)
        final = irh._loop(b, b.sdiv(xq.cols, _i64(256)), init, body)[0]
        for s in range(RT):
            v = b.fsub(final[s], final[RT + s], flags=ORDERED)
            ptr = b.gep(out.row(toks[s]), [b.mul(i, _i64(4))], inbounds=True)
            b.store(v, b.bitcast(ptr, v16f.as_pointer()), align=4)
        return ctx.get_dummy_value()

    return codegen


def _make_tile(RT):
    arrays = {0: types.uint8, 2: (types.int16, types.int8), 3: types.float32, 4: types.int32,
              6: types.float32}
    return _typed(f"ktile16_q4_k_16x{RT}", _k16_codegen(RT), arrays, ints=(1, 5, 7))


ktile16_q4_k_16x1 = _make_tile(1)
ktile16_q4_k_16x4 = _make_tile(4)


def _pack_codegen(ctx, b, sig, args):
    """pack16x_q4_k(wi, g, panel, scales, row): group g -> panel16's int16 panel and
    float scales (row `row` of each): per block j of a super-block, the panel's chunk 2m
    (2m + 1) lane l is row l's codes at columns 4m, 4m + 1 (4m + 2, 4m + 3) as int16, the
    lane's four code bytes of the x16 chunk spread to words by one byte shuffle; the scales
    d sc and -dmin m as panel16's pack16_q4_k computes them from the rows: the same panel
    and the same floats, so prefill's results are the rows layout's bit for bit, with no
    transpose (the rows are lanes already)."""
    w, panel, scales = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3))
    g, r = args[1], args[4]
    wrow, prow, srow = w.row(g), panel.row(r), scales.row(r)
    v16i, v16f, v64b = _v(I32, ROWS), _v(F32, ROWS), _v(I8, 64)
    nib = _c(v16i, [0x0F0F0F0F] * ROWS)
    zero = _c(v64b, [0] * 64)
    # word pairs of a lane's four bytes: (0, 1) and (2, 3), zero-extended (64: a zero byte)
    spread = [[x for lane in range(ROWS) for k in (q, q + 1) for x in (4 * lane + k, 64)]
              for q in (0, 2)]

    def body(sb, st):
        p = b.gep(wrow, [b.mul(sb, _i64(SB_BYTES))], inbounds=True)
        sc, mn = _scales_16(b, p)
        dd = _h2f(b, _load(b, p, 0, _v(I16, ROWS)))
        ndm = b.fneg(_h2f(b, _load(b, p, 32, _v(I16, ROWS))))
        for c in range(4):
            vs = [_load(b, p, 256 + 64 * (8 * c + m), v16i) for m in range(8)]
            for h in range(2):
                j = 2 * c + h
                blk = b.add(b.mul(sb, _i64(8)), _i64(j))
                pb = b.mul(blk, _i64(BLOCK16))
                for m, v in enumerate(vs):
                    n = b.bitcast(b.and_(b.lshr(v, _c(v16i, [4] * ROWS)) if h else v, nib), v64b)
                    for q in range(2):
                        _store_vec(b, prow, b.add(pb, _i64(64 * (2 * m + q))),
                                   _pick(b, n, spread[q], zero))
                so = b.mul(blk, _i64(4 * SCALES16))
                _store_vec(b, srow, so, b.fmul(b.uitofp(sc[j], v16f), dd, flags=FAST))
                _store_vec(b, srow, b.add(so, _i64(64)),
                           b.fmul(b.uitofp(mn[j], v16f), ndm, flags=FAST))
        return st

    irh._for(b, _i64(0), b.sdiv(w.cols, _i64(SB_BYTES)), [], body)
    return ctx.get_dummy_value()


pack16x_q4_k = _typed("pack16x_q4_k", _pack_codegen,
                      {0: types.uint8, 2: types.uint8, 3: types.float32}, ints=(1, 4))


@kernel(parallel=True)
def mm_panels(wi, xq, xd, xds, out, T):
    """Prefill on ActQ8's int16 blocks (AVX-512 VNNI): each group packed into panel16's
    panel (pack16x_q4_k), then met by the tokens as panel16 meets the rows layout's."""
    K = xq.shape[1]
    for g in prange(wi.shape[0]):
        panel = np.empty((1, K // 32 * BLOCK16), np.uint8)
        scales = np.empty((1, K // 32 * SCALES16), np.float32)
        toks = np.empty((1, 4), np.int64)
        pack16x_q4_k(wi, g, panel, scales, 0)
        _tokens16(Q4_K, panel, scales, xq, xd, xds, out, g * ROWS, T, toks)


@kernel
def mv_rows_sb(wi, xq, xd, xb, out, r0, r1):
    for g in range(r0 // ROWS, r1 // ROWS):
        ktile16_q4_k_16x1(wi, g, xq, xd, xb, 0, out, g * ROWS)


@kernel(parallel=True)
def mv_sb(wi, xq, xd, xb, out):
    for g in prange(wi.shape[0]):
        ktile16_q4_k_16x1(wi, g, xq, xd, xb, 0, out, g * ROWS)


@kernel(parallel=True)
def mm_sb(wi, xq, xd, xb, out, T):
    for g in prange(wi.shape[0]):
        t = 0
        while t + 4 <= T:
            ktile16_q4_k_16x4(wi, g, xq, xd, xb, t, out, g * ROWS)
            t += 4
        while t < T:
            ktile16_q4_k_16x1(wi, g, xq, xd, xb, t, out, g * ROWS)
            t += 1


@kernel
def _dequant_row(wi, g, l, sb, dst):
    """Row l of group g's super-block sb -> dst float32 [256]: d sc q - dmin m (ggml's)."""
    o = sb * SB_BYTES
    d = F16[np.int32(wi[g, o + 2 * l]) | (np.int32(wi[g, o + 2 * l + 1]) << 8)]
    dm = F16[np.int32(wi[g, o + 32 + 2 * l]) | (np.int32(wi[g, o + 33 + 2 * l]) << 8)]
    s = o + 64 + l  # scale byte k at s + 16 k
    for c in range(4):
        for h in range(2):
            j = 2 * c + h
            if j < 4:
                sc, m = np.int32(wi[g, s + 16 * j]) & 63, np.int32(wi[g, s + 16 * j + 64]) & 63
            else:
                a, lo, hi = (np.int32(wi[g, s + 16 * (j + 4)]), np.int32(wi[g, s + 16 * (j - 4)]),
                             np.int32(wi[g, s + 16 * j]))
                sc, m = (a & 15) | ((lo >> 6) << 4), (a >> 4) | ((hi >> 6) << 4)
            d1, m1 = d * np.float32(sc), dm * np.float32(m)
            for mm in range(8):
                q0 = o + 256 + 64 * (8 * c + mm) + 4 * l
                for k in range(4):
                    q = (np.int32(wi[g, q0 + k]) >> (4 * h)) & 15
                    dst[64 * c + 32 * h + 4 * mm + k] = d1 * np.float32(q) - m1


@kernel
def _dot_group(wi, g, x, t, acc, vals):
    """acc[l] = row 16g + l . x[t], l < 16; vals float32 [256] scratch."""
    for l in range(ROWS):
        a = np.float32(0.0)
        for sb in range(x.shape[1] // 256):
            _dequant_row(wi, g, l, sb, vals)
            s = np.float32(0.0)
            for j in range(256):
                s += vals[j] * x[t, 256 * sb + j]
            a += s
        acc[l] = a


@kernel
def mvp_rows(wi, x, out, r0, r1):
    vals, acc = np.empty(256, np.float32), np.empty(ROWS, np.float32)
    for g in range(r0 // ROWS, r1 // ROWS):
        _dot_group(wi, g, x, 0, acc, vals)
        out[0, g * ROWS:g * ROWS + ROWS] = acc


@kernel(parallel=True)
def mvp(wi, x, out):
    for g in prange(wi.shape[0]):
        vals, acc = np.empty(256, np.float32), np.empty(ROWS, np.float32)
        _dot_group(wi, g, x, 0, acc, vals)
        out[0, g * ROWS:g * ROWS + ROWS] = acc


@kernel(parallel=True)
def mmp(wi, x, out):
    for g in prange(wi.shape[0]):
        vals, acc = np.empty(256, np.float32), np.empty(ROWS, np.float32)
        for t in range(x.shape[0]):
            _dot_group(wi, g, x, t, acc, vals)
            out[t, g * ROWS:g * ROWS + ROWS] = acc


@kernel
def embed(wi, ids, out):
    for t in range(ids.shape[0]):
        g, l = ids[t] // ROWS, ids[t] % ROWS
        for sb in range(out.shape[1] // 256):
            _dequant_row(wi, g, l, sb, out[t, 256 * sb:256 * sb + 256])


KERNELS_X16_K = dict(mv_rows_sb=mv_rows_sb, mv_sb=mv_sb, mm_sb=mm_sb, mm_panels=mm_panels,
                     mvp_rows=mvp_rows, mvp=mvp, mmp=mmp, embed=embed)
