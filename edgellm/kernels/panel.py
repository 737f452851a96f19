"""Prefill's int8 tiles on packed weight panels (B = 32): no horizontal sums per token.

The row-group tile of codegen_int8.py dots each of 8 weight rows with a token separately and then
reduces the 8 dot-product vectors to one (vphaddd): per block and token, the reduction
costs as much as the dot products. A matrix product meets every weight block T times, so
prefill first packs 8 rows into a panel once (`pack_<type>`) and then runs the tokens
over it (`ptile_<type>_8x<RT>`):

  panel uint8 [., nb * 256]   per block, 8 chunks of 32 bytes; chunk c holds bytes 4c..4c+3
                              of rows 0..7 side by side, as unsigned values: q4 nibbles
                              0..15, q8_0 weights + 128 (w xor 0x80)
  scales float32 [., nb * 16] per block, the 8 rows' scales, then (q4_1) their minima

A token's 4 activation bytes 4c..4c+3, broadcast to all lanes, times chunk c is one
vpdpbusd whose lane r accumulates row r: after 8 of them each lane holds its row's whole
block dot product, and the float work (scales, offsets, the multiply-add) is done once
for the 8 rows as one vector, as codegen_int8.py's row-group tile does it: the same integers and
the same float operations in the same order. q8_0's +128 is taken back exactly in the
integers: each block's sum starts at -128 * (the sum of the token's 32 activation bytes),
ActQ8's xs. Measured against the row-group tiles (1536x576, 64 tokens): bit for bit the
same for q4_0 and q4_1; q8_0 within 1.5e-5 (LLVM associates its fast-math products
differently there), the same error against the float64 product.

  pack_<type>(w, i, panel, scales, g)                      rows i..i+7 -> panel row g
  ptile_<type>_8x<RT>(panel, scales, g, xq, xd, xs, xds, t, out, i)
                                                           out[t+s, i+r], s < RT, r < 8
int16 activations (xq int16, the default path's): the same panels, each chunk's 4
activations loaded as 8 bytes; the dot is vpdpwssd on AVX-512 VNNI, elsewhere the generic IR
(vpmaddwd on x86). The integer sums are exact either way, so the results are the same.

q6_k (a scale per 16 values, codes q - 32 in -32..31) has panels of its own meaning: the
chunks hold the signed codes (q - 32 as int8), and a block's scales are the 8 rows'
d sc of values 0-15, then of values 16-31 (where q4_1 keeps its minima). Its tile sums
chunks 0-3 and 4-7 apart (each half's sum of 16 products is exact in a float: < 2^24) and
adds (lo dw_lo + hi dw_hi) dx in the generic IR (int8 activations, or no VNNI). On int16
activations with AVX-512 VNNI, q6_k's panels are wide instead (pack_q6_k_wide, WIDE_BLOCK
bytes a block): each code times its scale, sc (q - 32), as int16 (|.| <= 4096), and one
scale d per row and block, so the tile is q8_0's (one vpdpwssd per chunk and token, one
float scale), faster than the 8-value halves.
Callers validate shapes (linear.py, matmul.py): these do not check bounds. Each intrinsic
is defined by name at the end of this file; a new type with int8 kernels adds its lines.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..codegen.int8_tiles import GROUP, group_blocks, scale_block
from ..codegen.ir import (
    F32,
    FAST,
    I8,
    I16,
    I32,
    I64,
    _c,
    _dot_acc,
    _drop_block,
    _f16,
    _for,
    _h2f,
    _i64,
    _llvm_fn,
    _load,
    _nibbles,
    _pair_dot,
    _pairsum,
    _pick,
    _Rows,
    _splat,
    _store_vec,
    _typed,
    _v,
)
from ..codegen.kquant_tiles import SUPER_BYTES, _codes, _q5_codes, _scales_k4
from ..codegen.packing import affine, block_layout, by_block_of, signed, weights
from ..modelfile import quant
from ..runtime.simd import VNNI

__all__ = ["PANEL_BLOCK", "SCALES_BLOCK", "make_pack", "make_ptile",
           "pack_q4_k", "pack_q5_k",
           "pack_q6_k", "pack_q6_k_wide", "ptile_q6_k_8x1", "ptile_q6_k_8x4",
           "q6_k_wide", "WIDE_BLOCK"]

PANEL_BLOCK = 32 * GROUP  # panel bytes per block: 32 weights of each of the 8 rows
WIDE_BLOCK = 2 * PANEL_BLOCK  # q6_k's int16 panels (int16 activations on VNNI)
SCALES_BLOCK = 2 * GROUP  # scales floats per block: 8 scales, 8 minima (q4_1)
CHAINS = 2  # independent vpdpbusd chains per token and block (integer sums: exact)
# q5_0, q5_1 (quant.TYPES): block bytes, offset of the high bits' word (after the header)
Q5 = {n: (t.block_bytes(32), t.header_bytes) for n, t in quant.TYPES.items()
      if t.bits == 5 and t.blocks == (32,)}


def _interleave(b, prow, pb, codes, group=I32):
    """Store 8 rows' 32 codes (<32 x i8>, or <32 x i16> with group=I64) as one panel block
    at byte pb of prow: chunk c holds values 4c..4c+3 of rows 0..7 side by side."""
    rows = [b.bitcast(code, _v(group, 8)) for code in codes]  # 8 four-value groups a row
    while len(rows) > 1:  # concatenate: 64 lanes, row r's group c at 8r + c
        rows = [_pick(b, rows[k], range(2 * rows[k].type.count), rows[k + 1])
                for k in range(0, len(rows), 2)]
    for c in range(8):
        chunk = _pick(b, rows[0], [8 * r + c for r in range(GROUP)])
        _store_vec(b, prow, b.add(pb, _i64(group.width * c)), chunk)


def _lanes(b, vecs, j):
    """<GROUP x f32> of lane j of each row's vector in vecs."""
    v = ir.Constant(_v(F32, GROUP), ir.Undefined)
    for r in range(GROUP):
        v = b.insert_element(v, b.extract_element(vecs[r], _c(I32, j)), _c(I32, r))
    return v


def _pack_codegen(kind, B):
    """Rows i..i+7 of the weight matrix (blocks of B) -> row g of panel and scales.

    The panel is always in 32-column sub-blocks: a weight block of 64 or 128 becomes 2 or
    4 of them, each with the block's scale (and minimum). A signed type (quant.Packing:
    q8_0, iq4_nl) packs its int8 weights w + 128 into q8_0's panels. q5_0 / q5_1: the 5-bit
    codes 0..31 (codegen_kquant._q5_codes) as a q4_1 panel, value d q + m, with q5_1's
    minimum, or q5_0's d (q - 16) as the minimum -16 d: both run on ptile_q4_1.
    """
    if kind in Q5:
        BB, hdr = Q5[kind]
    else:
        hdr, BB = block_layout(kind, B)
    low16 = _c(_v(I8, 32), [15] * 32)
    four = _c(_v(I8, 32), [4] * 32)
    flip = _c(_v(I8, 32), [-128] * 32)

    def sub_block(b, p, j):
        """Sub-block j of the weight block at p as <32 x i8> unsigned values."""
        if kind in Q5:
            return _q5_codes(b, p, hdr)
        if signed(kind):
            return b.xor(weights(b, kind, p, 32, 32 * j), flip)
        if B == 32:
            return _nibbles(b, p, hdr, 32)
        half = B // 2  # elements 0..half-1 are low nibbles, half..B-1 high ones
        if 32 * j < half:
            return b.and_(_load(b, p, hdr + 32 * j, _v(I8, 32)), low16)
        return b.lshr(_load(b, p, hdr + 32 * j - half, _v(I8, 32)), four)

    def codegen(ctx, b, sig, args):
        w, panel, scales = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3))
        i, g = args[1], args[4]
        wrow = [w.row(b.add(i, _i64(r))) for r in range(GROUP)]
        prow, srow = panel.row(g), scales.row(g)

        def gather16(ps, off):
            v = ir.Constant(_v(I16, GROUP), ir.Undefined)
            for r in range(GROUP):
                v = b.insert_element(v, _load(b, ps[r], off, I16), _c(I32, r))
            return _h2f(b, v)

        def body(bi, st):
            ps = [b.gep(row, [b.mul(bi, _i64(BB))], inbounds=True) for row in wrow]
            dw = gather16(ps, 0)
            if kind == "q5_0":  # d (q - 16) = d q + (-16 d)
                mw = b.fmul(dw, _c(_v(F32, GROUP), [-16.0] * GROUP), flags=FAST)
            else:
                mw = gather16(ps, 2) if affine(kind) or kind == "q5_1" else None
            for j in range(B // 32):
                sb = b.add(b.mul(bi, _i64(B // 32)), _i64(j))  # the panel's block
                _interleave(b, prow, b.mul(sb, _i64(PANEL_BLOCK)),
                            [sub_block(b, p, j) for p in ps])
                so = b.mul(sb, _i64(4 * SCALES_BLOCK))
                _store_vec(b, srow, so, dw)
                if mw is not None:
                    _store_vec(b, srow, b.add(so, _i64(4 * GROUP)), mw)
            return st

        _for(b, _i64(0), b.sdiv(w.cols, _i64(BB)), [], body)
        return ctx.get_dummy_value()

    return codegen


def _pack_k_codegen(kind):
    """pack for q4_k / q5_k rows (super-blocks of 256, block argument dropped): each 32-value
    sub-block j becomes a panel block with q4_1's meaning, value dw q + mw: dw = d sc_j,
    mw = -dmin m_j (codegen_kquant._scales_k4), the codes its 4-bit q (ggml's layout:
    sub-blocks 2c and 2c + 1 are the low and high nibbles of bytes 32c..32c+31 of qs), for
    q5_k with bit j of each qh byte as the fifth bit (codes 0..31)."""
    SB = SUPER_BYTES[kind]
    qs = 16 if kind == "q4_k" else 48
    return lambda ctx, b, sig, args: _pack_k(ctx, b, sig, args, SB, qs, kind == "q5_k")


def _pack_k(ctx, b, sig, args, SB, qs, five):
    w, panel, scales = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3))
    i, g = args[1], args[4]  # (w, i, panel, scales, g): block dropped
    wrow = [w.row(b.add(i, _i64(r))) for r in range(GROUP)]
    prow, srow = panel.row(g), scales.row(g)
    low16 = _c(_v(I8, 32), [15] * 32)
    four = _c(_v(I8, 32), [4] * 32)

    one = _c(_v(I8, 32), [1] * 32)

    def body(sbi, st):
        ps = [b.gep(row, [b.mul(sbi, _i64(SB))], inbounds=True) for row in wrow]
        dws, mws = [], []
        for p in ps:
            sc8, m8 = _scales_k4(b, p)
            dws.append(b.fmul(sc8, _splat(b, _f16(b, p, 0), 8), flags=FAST))
            mws.append(b.fmul(m8, _splat(b, b.fneg(_f16(b, p, 2)), 8), flags=FAST))
        for j in range(8):
            c, h = divmod(j, 2)
            codes = []
            for p in ps:
                raw = _load(b, p, qs + 32 * c, _v(I8, 32))
                code = b.and_(raw, low16) if h == 0 else b.lshr(raw, four)
                if five:  # q5_k: qh (bytes 16..47) bit j of byte e is element e's fifth bit
                    hb = b.and_(b.lshr(_load(b, p, 16, _v(I8, 32)), _c(_v(I8, 32), [j] * 32)),
                                one)
                    code = b.or_(code, b.shl(hb, four))
                codes.append(code)
            sb = b.add(b.mul(sbi, _i64(8)), _i64(j))  # the panel's block
            _interleave(b, prow, b.mul(sb, _i64(PANEL_BLOCK)), codes)
            so = b.mul(sb, _i64(4 * SCALES_BLOCK))
            _store_vec(b, srow, so, _lanes(b, dws, j))
            _store_vec(b, srow, b.add(so, _i64(4 * GROUP)), _lanes(b, mws, j))
        return st

    _for(b, _i64(0), b.sdiv(w.cols, _i64(SB)), [], body)
    return ctx.get_dummy_value()


def _pack_q6_k_codegen(wide):
    """pack for q6_k rows (super-blocks of 210 bytes: ql[128], qh[64], int8 sc[16], f16 d;
    block argument dropped), sub-block j (values 32j..32j+31) per panel block:
      byte panels  the signed codes q - 32 (codegen_kquant._codes), with the scales d sc[2j]
                   (values 0-15) and d sc[2j + 1] (values 16-31) in the places of q4_1's
                   scales and minima
      wide=True    (int16 activations on AVX-512 VNNI: pack_q6_k_wide) the values as int16
                   sc (q - 32), each code times its 16 values' int8 scale (|.| <= 4096), in
                   blocks of WIDE_BLOCK bytes (chunk c: values 4c..4c+3 of rows 0..7, 64
                   bytes), with the rows' d as the block's one scale: the tile is then
                   q8_0's, no halves summed apart. Sums stay in i32: 16 products of at most
                   4096 x 32767 a lane and block (< 2^31)."""
    v32w = _v(I16, 32)

    def codegen(ctx, b, sig, args):
        w, panel, scales = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3))
        i, g = args[1], args[4]  # (w, i, panel, scales, g): block dropped
        wrow = [w.row(b.add(i, _i64(r))) for r in range(GROUP)]
        prow, srow = panel.row(g), scales.row(g)
        SB = SUPER_BYTES["q6_k"]

        def body(sbi, st):
            ps = [b.gep(row, [b.mul(sbi, _i64(SB))], inbounds=True) for row in wrow]
            codes = [_codes(b, "q6_k", p) for p in ps]
            if wide:
                scs = [b.sext(_load(b, p, 192, _v(I8, 16)), _v(I16, 16)) for p in ps]
                d = ir.Constant(_v(F32, GROUP), ir.Undefined)
                for r, p in enumerate(ps):
                    d = b.insert_element(d, _f16(b, p, 208), _c(I32, r))
            else:
                dws = [b.fmul(b.sitofp(_load(b, p, 192, _v(I8, 16)), _v(F32, 16)),
                              _splat(b, _f16(b, p, 208), 16), flags=FAST) for p in ps]
            for j in range(8):
                sb = b.add(b.mul(sbi, _i64(8)), _i64(j))  # the panel's block
                so = b.mul(sb, _i64(4 * SCALES_BLOCK))
                if wide:
                    vals = [b.mul(b.sext(c[j], v32w),
                                  _pick(b, sc, [2 * j] * 16 + [2 * j + 1] * 16))
                            for c, sc in zip(codes, scs, strict=True)]
                    _interleave(b, prow, b.mul(sb, _i64(WIDE_BLOCK)), vals, I64)
                    _store_vec(b, srow, so, d)
                    continue
                _interleave(b, prow, b.mul(sb, _i64(PANEL_BLOCK)), [c[j] for c in codes])
                _store_vec(b, srow, so, _lanes(b, dws, 2 * j))
                _store_vec(b, srow, b.add(so, _i64(4 * GROUP)), _lanes(b, dws, 2 * j + 1))
            return st

        _for(b, _i64(0), b.sdiv(w.cols, _i64(SB)), [], body)
        return ctx.get_dummy_value()

    return codegen


def _madd16(b, acc, w, x):
    """<16 x i32> acc + w . x as <32 x i16> pairs (lane j: w[2j] x[2j] + w[2j+1] x[2j+1]):
    the generic IR of vpmaddwd and an add."""
    return b.add(acc, _pair_dot(b, b.bitcast(w, _v(I16, 32)), b.bitcast(x, _v(I16, 32))))


def _q6_k_block(b, wide, xrow, xoff, AB, dw_lo, dw_hi, dx, acc):
    """acc + one q6_k panel block for one token (8 rows) in the generic IR (int8
    activations, or no VNNI; int16 on VNNI has the wide panels): chunks 0-3 (values
    0-15) and 4-7 (values 16-31) summed apart, (lo dw_lo + hi dw_hi) dx. wide: the 8
    chunks' codes sign-extended to <32 x i32>; for int16 activations (AB 2) to <32 x i16>
    as <16 x i32>, whose pair sums (lanes 2r, 2r + 1: row r) are kept apart over a half's
    four chunks and reduced once (a reduction to the 8 rows every chunk bounded the tile)."""
    v8 = _v(F32, 8)
    halves = []
    A = ir.IntType(8 * AB)
    for h in range(2):
        if AB == 2:
            pair = _c(_v(I32, 16), [0] * 16)
            for c in range(4 * h, 4 * h + 4):
                x4 = _load(b, xrow, b.add(xoff, _i64(8 * c)), I64)
                pair = _madd16(b, pair, wide[c], b.bitcast(_splat(b, x4, 8), _v(I32, 16)))
            tot = b.add(_pick(b, pair, range(0, 16, 2)), _pick(b, pair, range(1, 16, 2)))
            halves.append(b.sitofp(tot, v8))
            continue
        tot = _c(_v(I32, 8), [0] * 8)
        for c in range(4 * h, 4 * h + 4):
            x4 = _splat(b, _load(b, xrow, b.add(xoff, _i64(4 * AB * c)),
                                 ir.IntType(32 * AB)), 8)
            x = b.sext(b.bitcast(x4, _v(A, 32)), _v(I32, 32))
            tot = b.add(tot, _pairsum(b, b.mul(wide[c], x)))
        halves.append(b.sitofp(tot, v8))
    f = b.fadd(b.fmul(halves[0], dw_lo, flags=FAST), b.fmul(halves[1], dw_hi, flags=FAST),
               flags=FAST)
    return b.fadd(acc, b.fmul(f, dx, flags=FAST), flags=FAST)


def _ptile_codegen(kind, RT, A=I8):
    """8 packed rows x RT tokens, all blocks (module docstring); activations int8 (A = I8)
    or int16 (I16: each chunk's 4 activations are 8 bytes; on AVX-512 VNNI the chunk
    widened to 32 x i16 once for the RT tokens and one vpdpwssd per chunk and token, whose
    lanes 2r, 2r + 1 hold row r; elsewhere the generic IR)."""
    v8 = _v(F32, 8)
    AB = A.width // 8
    X4 = ir.IntType(32 * AB)  # 4 activations
    wssd = VNNI and A == I16  # int16 activations on AVX-512 VNNI: vpdpwssd
    # int16 activations elsewhere (AVX2: vpmaddwd): the same pair sums kept apart over the
    # block's chunks and reduced once, not reduced to the 8 rows every chunk (the shuffles
    # that reduction takes bounded the tile; q6_k's two-scale blocks do the same: _q6_k_block)
    pairs16 = wssd or A == I16 and kind != "q6_k"
    # q8_0's six tokens are six independent vpdpwssd chains already: a second chain a
    # token costs an add each (measured slower); q4's tiles measured slower with one.
    # q6_k's wide panels: one chain, measured faster than two (8x4; 8x6 slower either way)
    q6w = wssd and kind == "q6_k"  # q6_k's wide panels: int16 sc (q - 32), one scale d
    chains = 1 if wssd and signed(kind) and RT >= 6 or q6w else CHAINS

    def codegen(ctx, b, sig, args):
        panel, scales, xq, xd, xs, xds, out = (
            _Rows(ctx, b, sig.args[k], args[k]) for k in (0, 1, 3, 4, 5, 6, 8))
        g, t, i = args[2], args[7], args[9]
        prow, srow = panel.row(g), scales.row(g)
        rows = [b.add(t, _i64(s)) for s in range(RT)]
        xrow = [xq.row(r) for r in rows]
        drow = [xd.row(r) for r in rows]
        irow = [xs.row(r) for r in rows]
        srows = [xds.row(r) for r in rows]
        zero_i = _c(_v(I32, 8), [0] * 8)
        v16i = _v(I32, 16)
        zero16 = _c(v16i, [0] * 16)
        dpw = _llvm_fn(b, "llvm.x86.avx512.vpdpwssd.512", v16i, [v16i] * 3) if wssd else None

        def madd(acc, w, x):
            """acc + w . x as i16 pairs: vpdpwssd on VNNI, else vpmaddwd and an add."""
            return b.call(dpw, [acc, w, x]) if wssd else _madd16(b, acc, w, x)

        def body(bi, st):
            pb = b.mul(bi, _i64(WIDE_BLOCK if q6w else PANEL_BLOCK))
            chunks = ([_load(b, prow, b.add(pb, _i64(64 * c)), _v(I16, 32)) for c in range(8)]
                      if q6w else
                      [_load(b, prow, b.add(pb, _i64(32 * c)), _v(I8, 32)) for c in range(8)])
            sb = b.mul(bi, _i64(4 * SCALES_BLOCK))
            dw = _load(b, srow, sb, v8)
            mw = (_load(b, srow, b.add(sb, _i64(4 * GROUP)), v8)  # q6_k: values 16-31's dw
                  if affine(kind) or kind == "q6_k" and not q6w else None)
            xoff = b.mul(bi, _i64(32 * AB))
            foff = b.mul(bi, _i64(4))
            new = []
            if kind == "q6_k" and not wssd:  # signed codes, two scales a block (docstring)
                wide = [b.bitcast(b.sext(ch, _v(I16, 32)), v16i) if A == I16 else
                        b.sext(ch, _v(I32, 32)) for ch in chunks]
                return [_q6_k_block(b, wide, xrow[s], xoff, AB, dw, mw,
                                    _splat(b, _load(b, drow[s], foff, F32), 8), st[s])
                        for s in range(RT)]
            if q6w:  # stored as 32 x i16
                wide = [b.bitcast(ch, v16i) for ch in chunks]
            elif pairs16:  # the chunks as 32 x i16 (row r's 4 weights in lanes 4r..4r+3), shared
                wide = [b.bitcast(b.zext(ch, _v(I16, 32)), v16i) for ch in chunks]
            for s in range(RT):
                if signed(kind):  # the +128 of the weights, taken back
                    tot = _splat(b, b.mul(_load(b, irow[s], foff, I32), _c(I32, -128)), 8)
                else:
                    tot = zero_i
                if pairs16:  # lanes 2r, 2r + 1 of the i32 sums are row r's
                    part = [zero16] * chains
                    for c in range(8):
                        x4 = _load(b, xrow[s], b.add(xoff, _i64(8 * c)), I64)
                        x4 = b.bitcast(_splat(b, x4, 8), v16i)
                        part[c % chains] = madd(part[c % chains], wide[c], x4)
                    acc = b.add(part[0], part[1]) if chains == 2 else part[0]
                    acc = b.add(_pick(b, acc, range(0, 16, 2)), _pick(b, acc, range(1, 16, 2)))
                    if q6w:  # one scale a block, no offset: q8_0's float work
                        new.append(scale_block(b, "q8_0", acc, drow[s], srows[s], foff, dw,
                                               None, st[s]))
                        continue
                    new.append(scale_block(b, kind, b.add(acc, tot), drow[s], srows[s], foff,
                                           dw, mw, st[s]))
                    continue
                part = [tot] + [zero_i] * (CHAINS - 1)
                for c in range(8):
                    x4 = _splat(b, _load(b, xrow[s], b.add(xoff, _i64(4 * AB * c)), X4), 8)
                    part[c % CHAINS] = _dot_acc(b, part[c % CHAINS], chunks[c],
                                                b.bitcast(x4, _v(A, 32)))
                while len(part) > 1:
                    part = [b.add(part[k], part[k + 1]) for k in range(0, len(part), 2)]
                new.append(scale_block(b, kind, part[0], drow[s], srows[s], foff, dw, mw,
                                       st[s]))
            return new

        group_blocks(b, b.sdiv(xq.cols, _i64(32)), RT, body, out, t, i, range(GROUP))
        return ctx.get_dummy_value()

    return codegen


@intrinsic
def q6_k_wide(typingctx, xq):
    """Whether q6_k's panels for activations xq are the wide ones (pack_q6_k_wide: int16
    activations on AVX-512 VNNI), as a compile-time constant."""
    wide = VNNI and isinstance(xq, types.Array) and xq.dtype == types.int16

    def codegen(ctx, b, sig, args):
        return ir.Constant(ir.IntType(1), int(wide))

    return types.boolean(xq), codegen


def make_pack(kind):
    """The intrinsic pack_<kind>(w, block, i, panel, scales, g) (K-quants: block ignored)."""
    name = f"pack_{kind}"
    if kind == "q6_k":
        codegen = _drop_block(_pack_q6_k_codegen(wide=False))
    elif kind in SUPER_BYTES:
        codegen = _drop_block(_pack_k_codegen(kind))
    else:
        codegen = by_block_of(kind, lambda B: _pack_codegen(kind, B))
    return _typed(name, codegen, {0: types.uint8, 3: types.uint8, 4: types.float32},
                  ints=(1, 2, 5))


def make_ptile(kind, RT):
    """The intrinsic ptile_<kind>_8x<RT>(panel, scales, g, xq, xd, xs, xds, t, out, i)."""
    name = f"ptile_{kind}_{GROUP}x{RT}"
    by_act = {types.int8: _ptile_codegen(kind, RT, I8), types.int16: _ptile_codegen(kind, RT, I16)}

    def codegen(ctx, b, sig, args):  # xq int8 or int16: the codegen follows its type
        return by_act[sig.args[3].dtype](ctx, b, sig, args)

    arrays = {0: types.uint8, 1: types.float32, 3: (types.int8, types.int16), 4: types.float32,
              5: types.int32, 6: types.float32, 8: types.float32}
    return _typed(name, codegen, arrays, ints=(2, 7, 9))


# q4_k and q5_k (and q5_0 / q5_1: tiles.py): packed as q4_1 panels, run on q4_1's tiles
pack_q4_k = make_pack("q4_k")
pack_q5_k = make_pack("q5_k")
# q6_k: signed codes and a scale per 16 values (int8 activations, no VNNI), or the wide
# panels of sc (q - 32) (int16 on VNNI; q6_k_wide says which), four tokens a tile
pack_q6_k = make_pack("q6_k")
pack_q6_k_wide = _typed("pack_q6_k_wide", _drop_block(_pack_q6_k_codegen(wide=True)),
                        {0: types.uint8, 3: types.uint8, 4: types.float32}, ints=(1, 2, 5))
ptile_q6_k_8x1 = make_ptile("q6_k", 1)
ptile_q6_k_8x4 = make_ptile("q6_k", 4)
