"""Kernels on q4_k and q6_k matrices stored in the x16 layout (modelfile/layout.py: 16 rows a
group, one row a <16 x i32> lane): a super-block's dot products need no horizontal sums, and
its scales, minima and float work are done once for 16 rows (llama.cpp repacks Q4_K at load
for the same reason: its q4_K_8x8 GEMV).

    make_x16_k(kind) -> {  (registry.py prefixes each role "x16_" in KERNELS[code])
      "mv_rows_sb"(wi, xq, xd, xb, out, r0, r1)   act_quant_k's super-block activations
                                                  (ActK), rows r0..r1-1 (multiples of 16)
      "mv_sb"(wi, xq, xd, xb, out)                the same, groups split between threads
      "mm_sb"(wi, xq, xd, xb, out, T)             several tokens: each group meets them
                                                  four, then one at a time ("tokens_sb"(wi,
                                                  g, xq, xd, xb, out, T): one group's)
      "mm_rows_sb"(wi, xq, xd, xb, out, r0, r1)   the same on rows r0..r1-1, one thread,
                                                  for xq's T = xq.shape[0] tokens (the
                                                  batched step's sequences)
      "mm_panels"(wi, xq, xd, xds, out, T)        prefill on ActQ8's int16 blocks (AVX-512
                                                  VNNI): each group packed into panel16's
                                                  int16 panel, met as panel16 meets rows
      "mvp_rows"(wi, x, out, r0, r1), "mvp"(wi, x, out), "mmp"(wi, x, out)
                                                  float activations: each row's
                                                  super-blocks dequantized as it goes
      "embed"(wi, ids, out)                       rows ids dequantized
    }
wi uint8 [rows / 16, nsb * 16 * SB]; out[t, r] as linear.py's. Callers validate shapes.

The tiles (ktile16_<kind>_16x<RT>) read a super-block in units (_phases): q4_k's 64-byte
chunk, lane l four code bytes of row l, masked to its low (high) nibbles; q6_k's two ql
chunks and one qh chunk, whose nibbles and 2-bit fields make four vectors of u8 codes
q + 32 (0..63). Each vector's lanes are four codes of a row at four columns. On AVX-512
VNNI with int16 activations (act_quant_k.SPLIT: a super-block's low bytes lo, then its high
bytes hi, x = 256 hi + lo) one vpdpbusd multiplies the codes by the token's four hi bytes
broadcast and one more the lo bytes (the u8 operand) by the codes as s8 (a code below 128
is either), as x16.py's halves on q4_0; int8 activations one vpdpbusd. Elsewhere (AVX2,
aarch64) the codes' bytes 0, 2 (1, 3) as i16 pairs against the activation pair broadcast
(adjacent where act_quant_k.DEINT stores each block's even values, then its odd ones):
vpmaddwd. A scale group's dot T (q6_k's less 32 x its 16 activations' sum) is exact in i32
and in f32 (|T| < 2^24); times its scale it is summed in float (a row's groups could pass
2^31 in integers), q4_k's minima's sum_j m_j xsum_j in integers, then d dx (and dmin dx)
per super-block, all as explicit fused multiply-adds: every tile's results (1 and 4
tokens) are the same bit for bit.
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
from ..modelfile import layout as layouts
from ..modelfile import quant
from ..runtime.simd import VNNI
from . import family
from .act_quant_k import SPLIT
from .family import kern, tile
from .jit import kernel
from .kquant import F16
from .matvec import named
from .panel16 import BLOCK16, SCALES16, _tokens16

__all__ = ["SB_BYTES", "TILES", "make_x16_k"]

ROWS = layouts.GROUP_ROWS
# a group's super-block: its bytes (layout.py's) and where its parts are
SB_BYTES = {kind: ROWS * n for kind, n in layouts.SB_BYTES.items()}
SB_Q4K, SB_Q6K = SB_BYTES["q4_k"], SB_BYTES["q6_k"]
Q4K_CODES = 256  # q4_k: d, dmin (32 bytes each), 12 scale bytes a row, then the codes
Q6K_SC, Q6K_UNITS = 32, layouts.Q6K_HEAD  # q6_k: d, 16 int8 scales a row, then units of
# three code chunks
CHAINS = 2  # accumulator chains a block (their sum is the same integer)
MASK4, MASK2 = 0x0F0F0F0F, 0x30303030


def _scales_16(b, p):
    """q4_k: the 16 rows' 6-bit scales and minima of the group's super-block at p: two lists
    of 8 <16 x i32> (block j's, a lane a row), ggml's get_scale_min_k4 on byte vectors."""
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


def _phases(kind):
    """A super-block's reading order: [(units, groups)], each unit's code vectors added
    into its groups' sums, the groups done after their phase. A group is a scale's columns
    (q4_k: block j of 32, q6_k: 16 columns g)."""
    if kind == "q4_k":
        return [([(c, m) for m in range(8)], [2 * c, 2 * c + 1]) for c in range(4)]
    return [([(h, m) for m in range(4 * mh, 4 * mh + 4)],
             [8 * h + 2 * jq + mh for jq in range(4)]) for h in range(2) for mh in range(2)]


def _unit_codes(b, kind, p, unit):
    """A unit's code vectors: [(group, column, <16 x i32>)], lane l four u8 codes of row l
    at columns column..column + 3 (q4_k 0..15, q6_k 0..63)."""
    v16i = _v(I32, ROWS)

    def k(n):
        return _c(v16i, [n] * ROWS)
    if kind == "q4_k":
        c, m = unit
        v = _load(b, p, Q4K_CODES + 64 * (8 * c + m), v16i)
        return [(2 * c, 64 * c + 4 * m, b.and_(v, k(MASK4))),
                (2 * c + 1, 64 * c + 32 + 4 * m, b.and_(b.lshr(v, k(4)), k(MASK4)))]
    h, m = unit  # ql's bytes 64h + 4m.. (low / high nibbles: columns +0, +64) and 4m + 32..
    # (+32, +96); qh's 32h + 4m.. hold the four columns' top two bits at bits 0, 2, 4, 6:
    # the unit's three chunks, side by side (layout.py)
    u = Q6K_UNITS + 192 * (8 * h + m)
    lo, hi, top = (_load(b, p, u + 64 * x, v16i) for x in range(3))
    low = [b.and_(lo, k(MASK4)), b.and_(hi, k(MASK4)),
           b.and_(b.lshr(lo, k(4)), k(MASK4)), b.and_(b.lshr(hi, k(4)), k(MASK4))]
    bits = [b.shl(top, k(4)), b.shl(top, k(2)), top, b.lshr(top, k(2))]
    return [(8 * h + 2 * jq + m // 4, 128 * h + 32 * jq + 4 * m,
             b.or_(low[jq], b.and_(bits[jq], k(MASK2)))) for jq in range(4)]


def _k16_codegen(kind, RT):
    """ktile16_<kind>_16x<RT>(wi, g, xq, xd, xb, t, out, i): out[t + s, i + r] = row 16g + r
    of W . token t + s, r < 16, s < RT; xq ActK's int16 or int8 (SPLIT, DEINT or in order,
    as act_quant_k stores them), xd [T, K/256], xb [T, K/16]."""
    v16i, v16f, v32w = _v(I32, ROWS), _v(F32, ROWS), _v(I16, 2 * ROWS)
    SB = SB_BYTES[kind]
    mins = kind == "q4_k"  # value d sc q - dmin m; q6_k's d sc (q - 32)
    phases = _phases(kind)

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

        def add_unit(acc, x0, codes, n):
            """acc[s][group] = (hi chains, lo chains, count) + the unit's products: a group's
            units take its n chains in turn."""
            for grp, col, cv in codes:
                for s in range(RT):
                    hi, lo, cnt = acc[s].setdefault(grp, ([zero] * n, [zero] * n, [0]))
                    c = cnt[0] % n
                    cnt[0] += 1
                    if mode == "pairs":  # i16 pairs of the codes at col + q, col + q + 2
                        for q in range(2):
                            wv = b.bitcast(b.and_(b.lshr(cv, k32(8 * q)) if q else cv,
                                                  k32(0x00FF00FF)), v32w)
                            lo[c] = b.add(lo[c], irh._pair_dot(b, wv, xpair(s, x0, col, q)))
                    elif mode == "busd":
                        lo[c] = b.call(dpb, [lo[c], cv, bcast4(s, b.add(x0, _i64(col)))])
                    else:
                        hi[c] = b.call(dpb, [hi[c], cv, bcast4(s, b.add(x0, _i64(256 + col)))])
                        lo[c] = b.call(dpb, [lo[c], bcast4(s, b.add(x0, _i64(col))), cv])

        def body(sb, st):
            p = b.gep(wrow, [b.mul(sb, _i64(SB))], inbounds=True)
            x0 = b.mul(sb, _i64(256 * AB))
            if mins:
                sc, mn = _scales_16(b, p)
                scf = [b.uitofp(v, v16f) for v in sc]
                dm = _h2f(b, _load(b, p, 32, _v(I16, ROWS)))
            else:
                scf = [b.sitofp(_load(b, p, Q6K_SC + 16 * j, _v(I8, ROWS)), v16f)
                       for j in range(16)]
            dd = _h2f(b, _load(b, p, 0, _v(I16, ROWS)))
            xs = [_load(b, brows[s], b.mul(sb, _i64(64)), v16i) for s in range(RT)]  # per 16
            n = CHAINS if mode == "split" else 1
            sums = [None] * RT  # each token's sum over groups of sc T (float)
            for units, groups in phases:
                acc = [{} for _ in range(RT)]
                for unit in units:
                    add_unit(acc, x0, _unit_codes(b, kind, p, unit), n)
                for grp in groups:
                    for s in range(RT):
                        hi, lo, _ = acc[s][grp]
                        H, L = hi[0], lo[0]
                        for c in range(1, n):
                            H, L = b.add(H, hi[c]), b.add(L, lo[c])
                        tot = b.add(b.shl(H, k32(8)), L) if mode == "split" else L
                        if not mins:  # q6_k's codes are q + 32: 32 x the 16 values' sum off
                            tot = b.sub(tot, b.shl(_pick(b, xs[s], [grp] * ROWS), k32(5)))
                        tf = b.sitofp(tot, v16f)
                        sums[s] = (b.fmul(tf, scf[grp], flags=ORDERED) if sums[s] is None
                                   else fma(tf, scf[grp], sums[s]))
            new = list(st)
            for s in range(RT):
                dx = _splat(b, _load(b, drows[s], b.mul(sb, _i64(4)), F32), ROWS)
                new[s] = fma(sums[s], b.fmul(dd, dx, flags=ORDERED), new[s])
                if mins:
                    xs8 = b.add(_pick(b, xs[s], range(0, 16, 2)), _pick(b, xs[s], range(1, 16, 2)))
                    msum = None
                    for j in range(8):
                        term = b.mul(mn[j], _pick(b, xs8, [j] * ROWS))
                        msum = term if msum is None else b.add(msum, term)
                    new[RT + s] = fma(b.sitofp(msum, v16f), b.fmul(dm, dx, flags=ORDERED),
                                      new[RT + s])
            return new

        init = [_c(v16f, [0.0] * ROWS)] * ((2 if mins else 1) * RT)
        final = irh._loop(b, b.sdiv(xq.cols, _i64(256)), init, body)[0]
        for s in range(RT):
            v = b.fsub(final[s], final[RT + s], flags=ORDERED) if mins else final[s]
            ptr = b.gep(out.row(toks[s]), [b.mul(i, _i64(4))], inbounds=True)
            b.store(v, b.bitcast(ptr, v16f.as_pointer()), align=4)
        return ctx.get_dummy_value()

    return codegen


def _make_tile(kind, RT):
    arrays = {0: types.uint8, 2: (types.int16, types.int8), 3: types.float32, 4: types.int32,
              6: types.float32}
    return _typed(f"ktile16_{kind}_16x{RT}", _k16_codegen(kind, RT), arrays, ints=(1, 5, 7))


def _pack_codegen(kind):
    """pack16x_<kind>(wi, g, panel, scales, row): group g -> panel16's int16 panel and float
    scales (row `row` of each), what its pack16_<kind> makes of the same 16 rows: per block
    of 32 columns, chunk c lane l is row l's values at columns 2c, 2c + 1 as int16 (q4_k's
    codes q, q6_k's sc (q - 32)), each code vector's four bytes spread to words by one byte
    shuffle; q4_k's scales d sc and -dmin m, q6_k's d, computed as panel16 computes them.
    The same panel and floats, so prefill's results are the rows layout's bit for bit, with
    no transpose: the rows are lanes already."""
    SB = SB_BYTES[kind]
    mins = kind == "q4_k"

    def codegen(ctx, b, sig, args):
        w, panel, scales = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3))
        g, r = args[1], args[4]
        wrow, prow, srow = w.row(g), panel.row(r), scales.row(r)
        v16f, v64b, v32w = _v(F32, ROWS), _v(I8, 64), _v(I16, 2 * ROWS)
        zero = _c(v64b, [0] * 64)
        # a lane's bytes (0, 1) and (2, 3) as words, zero-extended (index 64: a zero byte)
        spread = [[x for lane in range(ROWS) for k in (q, q + 1) for x in (4 * lane + k, 64)]
                  for q in (0, 2)]

        def body(sb, st):
            p = b.gep(wrow, [b.mul(sb, _i64(SB))], inbounds=True)
            dd = _h2f(b, _load(b, p, 0, _v(I16, ROWS)))
            if mins:
                sc, mn = _scales_16(b, p)
                ndm = b.fneg(_h2f(b, _load(b, p, 32, _v(I16, ROWS))))
            else:  # each row's scale in both words of its lane
                sc16 = [_pick(b, b.sext(_load(b, p, Q6K_SC + 16 * j, _v(I8, ROWS)),
                                        _v(I16, ROWS)), [x // 2 for x in range(2 * ROWS)])
                        for j in range(16)]
            for units, _groups in _phases(kind):
                for unit in units:
                    for grp, col, cv in _unit_codes(b, kind, p, unit):
                        blk = b.add(b.mul(sb, _i64(8)), _i64(col // 32))
                        pb = b.mul(blk, _i64(BLOCK16))
                        for q in range(2):
                            wv = _pick(b, b.bitcast(cv, v64b), spread[q], zero)
                            if not mins:
                                wv = b.mul(b.sub(b.bitcast(wv, v32w), _c(v32w, [32] * 32)),
                                           sc16[grp])
                            chunk = col % 32 // 2 + q
                            _store_vec(b, prow, b.add(pb, _i64(64 * chunk)), wv)
            for j in range(8):
                so = b.mul(b.add(b.mul(sb, _i64(8)), _i64(j)), _i64(4 * SCALES16))
                if mins:
                    _store_vec(b, srow, so, b.fmul(b.uitofp(sc[j], v16f), dd, flags=FAST))
                    _store_vec(b, srow, b.add(so, _i64(64)),
                               b.fmul(b.uitofp(mn[j], v16f), ndm, flags=FAST))
                else:
                    _store_vec(b, srow, so, dd)
            return st

        irh._for(b, _i64(0), b.sdiv(w.cols, _i64(SB)), [], body)
        return ctx.get_dummy_value()

    return codegen


def _make_pack(kind):
    return _typed(f"pack16x_{kind}", _pack_codegen(kind),
                  {0: types.uint8, 2: types.uint8, 3: types.float32}, ints=(1, 4))


TILES = {kind: (_make_tile(kind, 1), _make_tile(kind, 4), _make_pack(kind))
         for kind in SB_BYTES}
for _kind, (_t1, _t4, _pack) in TILES.items():  # the kernels below call them by code
    family.TILES.setdefault(quant.TYPES[_kind].code, {}).update(
        x16_1=_t1, x16_4=_t4, x16_pack=_pack)
Q4K_CODE = quant.TYPES["q4_k"].code


@kernel
def _dequant_q4_k(wi, g, l, sb, dst):
    """Row l of group g's q4_k super-block sb -> dst float32 [256]: d sc q - dmin m."""
    o = sb * SB_Q4K
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
                q0 = o + Q4K_CODES + 64 * (8 * c + mm) + 4 * l
                for k in range(4):
                    q = (np.int32(wi[g, q0 + k]) >> (4 * h)) & 15
                    dst[64 * c + 32 * h + 4 * mm + k] = d1 * np.float32(q) - m1


@kernel
def _dequant_q6_k(wi, g, l, sb, dst):
    """Row l of group g's q6_k super-block sb -> dst float32 [256]: d sc (q - 32)."""
    o = sb * SB_Q6K
    d = F16[np.int32(wi[g, o + 2 * l]) | (np.int32(wi[g, o + 2 * l + 1]) << 8)]
    for h in range(2):
        for m in range(8):
            a = o + Q6K_UNITS + 192 * (8 * h + m) + 4 * l
            bq, t = a + 64, a + 128
            for k in range(4):
                lo, hi, top = np.int32(wi[g, a + k]), np.int32(wi[g, bq + k]), \
                    np.int32(wi[g, t + k])
                qs = ((lo & 15) | ((top & 3) << 4), (hi & 15) | (((top >> 2) & 3) << 4),
                      (lo >> 4) | (((top >> 4) & 3) << 4), (hi >> 4) | (((top >> 6) & 3) << 4))
                for jq in range(4):
                    col = 128 * h + 32 * jq + 4 * m + k
                    sc = np.float32(np.int8(wi[g, o + Q6K_SC + 16 * (col // 16) + l]))
                    dst[col] = (d * sc) * np.float32(qs[jq] - 32)


@kernel
def _dequant(code, wi, g, l, sb, dst):
    """Row l of group g's super-block sb of type `code` (q4_k or q6_k) -> dst float32 [256]."""
    if code == Q4K_CODE:
        _dequant_q4_k(wi, g, l, sb, dst)
    else:
        _dequant_q6_k(wi, g, l, sb, dst)


@kernel
def _dot_group(code, wi, g, x, t, out, vals):
    """out[t, 16g + l] = row 16g + l . x[t], l < 16, type `code`; vals float32 [256] scratch."""
    for l in range(ROWS):
        a = np.float32(0.0)
        for sb in range(x.shape[1] // 256):
            _dequant(code, wi, g, l, sb, vals)
            s = np.float32(0.0)
            for j in range(256):
                s += vals[j] * x[t, 256 * sb + j]
            a += s
        out[t, g * ROWS + l] = a


def make_x16_k(kind: str) -> dict:
    """Type `kind`'s x16 kernels (the module docstring). Each closes over the type's code
    alone and finds its tiles with family.tile: numba keys a cached kernel by its closure's
    pickle, and an intrinsic's (or a dispatcher's) pickle differs from process to process,
    which made every start compile these kernels again."""
    code = quant.TYPES[kind].code

    @kernel
    @named(f"mv_rows_sb_x16_{kind}")
    def mv_rows_sb(wi, xq, xd, xb, out, r0, r1):
        for g in range(r0 // ROWS, r1 // ROWS):
            tile(code, "x16_1", wi, g, xq, xd, xb, 0, out, g * ROWS)

    @kernel(parallel=True)
    @named(f"mv_sb_x16_{kind}")
    def mv_sb(wi, xq, xd, xb, out):
        for g in prange(wi.shape[0]):
            tile(code, "x16_1", wi, g, xq, xd, xb, 0, out, g * ROWS)

    @kernel
    @named(f"tokens_sb_x16_{kind}")
    def tokens_sb(wi, g, xq, xd, xb, out, T):
        """out[:T, 16g:16g + 16]: four, then one token a tile."""
        t = 0
        while t + 4 <= T:
            tile(code, "x16_4", wi, g, xq, xd, xb, t, out, g * ROWS)
            t += 4
        while t < T:
            tile(code, "x16_1", wi, g, xq, xd, xb, t, out, g * ROWS)
            t += 1

    @kernel(parallel=True)
    @named(f"mm_sb_x16_{kind}")
    def mm_sb(wi, xq, xd, xb, out, T):
        for g in prange(wi.shape[0]):
            kern(code, "x16_tokens_sb", wi, g, xq, xd, xb, out, T)

    @kernel
    @named(f"mm_rows_sb_x16_{kind}")
    def mm_rows_sb(wi, xq, xd, xb, out, r0, r1):
        for g in range(r0 // ROWS, r1 // ROWS):
            kern(code, "x16_tokens_sb", wi, g, xq, xd, xb, out, xq.shape[0])

    @kernel(parallel=True)
    @named(f"mm_panels_x16_{kind}")
    def mm_panels(wi, xq, xd, xds, out, T):
        """Prefill on ActQ8's int16 blocks (AVX-512 VNNI): each group packed into
        panel16's panel, then met by the tokens as panel16 meets the rows layout's."""
        K = xq.shape[1]
        for g in prange(wi.shape[0]):
            panel = np.empty((1, K // 32 * BLOCK16), np.uint8)
            scales = np.empty((1, K // 32 * SCALES16), np.float32)
            toks = np.empty((1, 4), np.int64)
            tile(code, "x16_pack", wi, g, panel, scales, 0)
            _tokens16(code, panel, scales, xq, xd, xds, out, g * ROWS, T, toks)

    @kernel
    @named(f"mvp_rows_x16_{kind}")
    def mvp_rows(wi, x, out, r0, r1):
        vals = np.empty(256, np.float32)
        for g in range(r0 // ROWS, r1 // ROWS):
            _dot_group(code, wi, g, x, 0, out, vals)

    @kernel(parallel=True)
    @named(f"mvp_x16_{kind}")
    def mvp(wi, x, out):
        for g in prange(wi.shape[0]):
            _dot_group(code, wi, g, x, 0, out, np.empty(256, np.float32))

    @kernel(parallel=True)
    @named(f"mmp_x16_{kind}")
    def mmp(wi, x, out):
        for g in prange(wi.shape[0]):
            vals = np.empty(256, np.float32)
            for t in range(x.shape[0]):
                _dot_group(code, wi, g, x, t, out, vals)

    @kernel
    @named(f"embed_x16_{kind}")
    def embed(wi, ids, out):
        for t in range(ids.shape[0]):
            g, l = ids[t] // ROWS, ids[t] % ROWS
            for sb in range(out.shape[1] // 256):
                _dequant(code, wi, g, l, sb, out[t, 256 * sb:256 * sb + 256])

    return dict(mv_rows_sb=mv_rows_sb, mv_sb=mv_sb, mm_sb=mm_sb, mm_rows_sb=mm_rows_sb,
                tokens_sb=tokens_sb, mm_panels=mm_panels,
                mvp_rows=mvp_rows, mvp=mvp, mmp=mmp, embed=embed)
