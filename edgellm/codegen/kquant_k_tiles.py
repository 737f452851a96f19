"""Code generator of the K-quant tiles on super-block activations: q4_k, q5_k, q6_k weights
(ggml's 256-value super-blocks, as stored) x int16 or int8 activations quantized per 256
values (kernels/act_quant_k.py: one float scale dx per super-block, int32 sums per 16).

`kk_codegen(kind, RT)` is the code of kquant_tiles.make_ktile's intrinsic
ktile_<kind>_1x<RT>(W, block, i, xq, xd, xb, t, out) where xb is int32 (block is ignored):
out[t + s, i] = W[i] . x[t + s] for s < RT.

With one activation scale per super-block, a super-block's sum is an integer times d dx,
so the weights' per-block scales are multiplied in integers and the 8 blocks summed in one
<16 x i32> vector, converted to float once per super-block (no per-block reduction or
float work; llama.cpp's q4_K x q8_K, ggml-cpu's x86 quants.c):
  int16 x   on AVX-512 VNNI (act_quant_k.SPLIT: x as low bytes lo = x & 255 and high bytes
            hi = x >> 8, x = 256 hi + lo): per 64 values two vpdpbusd (u8 x s8, 4 products
            a lane), 256 (codes . hi) + lo . codes, exact over all of int16 (q4_k/q5_k
            codes 0..31 pass as u8 and as s8; q6_k's q - 32 on the low bytes, and on the
            high bytes q . hi - 32 . hi, a third vpdpbusd: a lane holds only its own
            values), then the lane times its block's scale (vpmulld), where widening the
            codes to 16 bits and multiplying them by the scale cost a vpmullw per 32.
            Decode's q4_k / q5_k tile (RT = 1) keeps the two dots apart in a lane's i16
            halves, (H << 16) + L with H = codes . hi (|H| < 2^14) and L = lo . codes
            (0 <= L < 2^15), and one vpdpwssd with the pair (sc, 256 sc) adds sc (256 H +
            L) to the super-block's sum: the same integer, for a vpmulld and a vpaddd less
            a 64 values (q6_k's L can be negative, which borrows from H: it keeps vpmulld).
            A lane sums 16 products a super-block: |16 x 4096 x 32768| <= 2^31. Elsewhere
            the codes widened to 16 bits times the block's scale, then a pair-sum dot with
            x (vpmaddwd); on x86 (DEINT: act_quant_k stores each block of x as its even
            values, then its odd ones) the codes are read as 16-bit words, whose low and high bytes
            are a block's even and odd values, and masked and shifted in 16-bit lanes
            (_code_words), not widened byte by byte on the shuffle port: lanes 0-7 sum the
            even values' pairs (4k, 4k + 2), lanes 8-15 the odd ones'. The lanes group the
            products differently on the three paths (4 neighbours, pairs of each block, or
            pairs of its even and of its odd values), so their float results may differ in
            the last bits; the integers a super-block sums are the same
  int8 x    on AVX-512 VNNI: two blocks' unsigned codes . x in one vpmaddubsw (16-bit
            pair sums: |2 x 63 x 128| < 2^15), then one vpdpwssd with the scales (q6_k's
            codes unsigned 0..63: 32 sum(sc_h xb_h) is taken off the lanes); elsewhere the
            int16 form on sign-extended x
  minima    q4_k/q5_k's value d sc q - dmin m: sum_j m_j xb_j (sums per 16, each minimum
            twice) as one <16 x i32> product a super-block, times dmin dx
"""

from __future__ import annotations

from numba import types

from ..runtime.simd import GFNI, VNNI, X86
from . import ir as irh
from .ir import F32, FAST, I8, I16, I32, _c, _i64, _load, _pair_dot, _pick, _splat, _v
from .kquant_tiles import SUPER_BYTES, _codes, _sc_min_bytes

__all__ = ["DEINT", "kk_codegen"]

_MINS = ("q4_k", "q5_k")
# off VNNI on x86 (AVX2, the generic path) the tiles read the codes as 16-bit words
# (_code_words), against activations stored as each block's even values, then its odd ones
# (act_quant_k writes them so, for both dtypes); aarch64 keeps the values in order (untimed)
DEINT = X86 and not VNNI
NACC = 2  # integer accumulators a super-block (summed at its end)
# bytes the one-token tile (decode's) prefetches ahead of the super-block it reads, into L1:
# a row's super-blocks, then the next row's, are one stream, which the hardware prefetcher
# alone keeps too few lines ahead of on one core (and does not follow across the 4 KiB
# pages a file mapping is made of); into L1 beat L2 on the model file's own pages
PF = 8192


# gf2p8affineqb's bit matrices (one a 64-bit lane, row 0 in the top byte): byte & 15 in
# the low 256 bits, byte >> 4 in the high 256
_NIBBLES = [0x0102040800000000] * 4 + [0x1020408000000000] * 4


def _codes_pairs_q4k(b, p):
    """q4_k's super-block at p as 4 <64 x i8> codes, blocks (2k, 2k + 1) side by side: each
    32 bytes broadcast to both halves (a load), then with GFNI one gf2p8affineqb (the low
    half's bytes & 15, the high half's >> 4), else one 16-bit shift by 0 or 4 a half and a
    mask (where splitting the nibbles of 32 bytes and joining two halves took three)."""
    if GFNI:
        affine = irh._llvm_fn(b, "llvm.x86.vgf2p8affineqb.512", _v(I8, 64),
                              [_v(I8, 64), _v(I8, 64), I8])
        mat = b.bitcast(_c(_v(irh.I64, 8), _NIBBLES), _v(I8, 64))
        return [b.call(affine, [_pick(b, _load(b, p, 16 + 32 * k, _v(I8, 32)),
                                      list(range(32)) * 2), mat, _c(I8, 0)])
                for k in range(4)]
    shift = _c(_v(I16, 32), [0] * 16 + [4] * 16)
    srlv = irh._llvm_fn(b, "llvm.x86.avx512.psrlv.w.512", _v(I16, 32), [_v(I16, 32)] * 2)
    out = []
    for k in range(4):
        raw = _load(b, p, 16 + 32 * k, _v(I8, 32))
        both = b.bitcast(_pick(b, raw, list(range(32)) * 2), _v(I16, 32))
        out.append(b.and_(b.bitcast(b.call(srlv, [both, shift]), _v(I8, 64)),
                          _c(_v(I8, 64), [15] * 64)))
    return out


def _code_words(b, kind, p, g):
    """Block g of the super-block at p as its (even, odd) <16 x i16> codes (q4_k/q5_k
    unsigned, q6_k q - 32): 32 code bytes loaded as 16-bit words, byte 2j (value 2j) the low
    half of word j and byte 2j + 1 the high, so masks and shifts in 16-bit lanes take the
    even and odd values apart (DEINT's order of x) with no widening shuffle. q5_k's
    and q6_k's high bits are shifted to bits 4 and 12 of the nibbles' word, so that one or
    joins both halves' and one mask and one shift part them. One block at a time, made
    where its dot needs it: all eight at once held more registers than AVX2 has."""
    v = _v(I16, 16)

    def k(n):
        return _c(v, [n] * 16)

    def shift(x, n):  # x << n (n may be negative: a right shift)
        return b.shl(x, k(n)) if n > 0 else b.lshr(x, k(-n)) if n < 0 else x

    if kind == "q4_k":  # blocks 2c, 2c + 1: chunk c's low, high nibbles
        w = _load(b, p, 16 + 32 * (g // 2), v)
        if g % 2:
            return b.and_(b.lshr(w, k(4)), k(15)), b.lshr(w, k(12))
        return b.and_(w, k(15)), b.and_(b.lshr(w, k(8)), k(15))
    if kind == "q5_k":  # the nibbles as q4_k's, bit g of qh's bytes 2j, 2j + 1 above them
        nib = shift(_load(b, p, 48 + 32 * (g // 2), v), -4 * (g % 2))
        top = b.and_(shift(_load(b, p, 16, v), 4 - g), k(0x1010))
    else:  # q6_k: blocks 4h + j: ql0, ql1's low nibbles, then their high ones; bits 2j of qh
        h, j = divmod(g, 4)
        nib = shift(_load(b, p, 64 * h + 32 * (j % 2), v), -4 * (j // 2))
        top = b.and_(shift(_load(b, p, 128 + 32 * h, v), 4 - 2 * j), k(0x3030))
    t = b.or_(b.and_(nib, k(0x0F0F)), top)
    e, o = b.and_(t, k(0xFF)), b.lshr(t, k(8))
    if kind == "q6_k":
        return b.sub(e, k(32)), b.sub(o, k(32))
    return e, o


def _f16_pair(b, p, dx):
    """The f16 d, dmin at p times the float dx, each splat to <16 x f32>: one conversion
    and one multiply for the two."""
    dd = irh._h2f(b, b.bitcast(_load(b, p, 0, I32), _v(I16, 2)))
    dd = b.fmul(dd, _splat(b, dx, 2), flags=FAST)
    return [_pick(b, dd, [k] * 16) for k in range(2)]


def kk_codegen(kind, RT):
    """The tile's codegen (make_ktile's on int32 sums: the module docstring)."""
    SB = SUPER_BYTES[kind]
    mins = kind in _MINS
    v16f, v16i = _v(F32, 16), _v(I32, 16)

    def codegen(ctx, b, sig, args):
        w, xq, xd, xb, out = (irh._Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
        i, t = args[1], args[5]
        A = I16 if sig.args[2].dtype == types.int16 else I8
        AB = A.width // 8
        busd = VNNI and A == I8  # vpmaddubsw + vpdpwssd
        split = VNNI and A == I16  # vpdpbusd on the low and high bytes (act_quant_k.SPLIT)
        # decode's q4_k / q5_k tile: a lane's codes . x as the i16 pair (L, H), scaled and
        # summed by one vpdpwssd (module docstring); the several-token tiles keep vpmulld
        # (the same integers in the same lanes: the same floats)
        pairs = split and mins and RT == 1
        words = DEINT  # the codes as 16-bit words against x's even and odd values
        wrow = w.row(i)
        toks = [b.add(t, _i64(s)) for s in range(RT)]
        xrow, drow, brow = ([a.row(tk) for tk in toks] for a in (xq, xd, xb))
        zero16 = _c(v16i, [0] * 16)
        if busd:
            mubs = irh._llvm_fn(b, "llvm.x86.avx512.pmaddubs.w.512", _v(I16, 32),
                                [_v(I8, 64), _v(I8, 64)])
        if split:
            dpb = irh._llvm_fn(b, "llvm.x86.avx512.vpdpbusd.512", v16i, [v16i] * 3)
            c32 = b.bitcast(_c(_v(I8, 64), [32] * 64), v16i)

        def body(sb, st):
            p = b.gep(wrow, [b.mul(sb, _i64(SB))], inbounds=True)
            if RT == 1:
                for c in range(0, SB, 64):
                    irh._prefetch(b, b.gep(p, [_i64(PF + c)]), level=1)
            if mins:
                sm = _sc_min_bytes(b, p)
                sc16 = b.zext(sm, _v(I16, 16))  # lanes 0-7 sc, 8-15 m
                # a block's scale on its 32 values (int16 path), or on 16 pair sums (int8)
                if pairs:  # as i16 pairs (sc, 256 sc) on two blocks' lanes: bytes sc 0 0 sc
                    zero8 = _c(_v(I8, 16), [0] * 16)
                    scale = [b.bitcast(_pick(b, sm, [g for j in range(16) for g in
                                                     (2 * k + j // 8, 16, 16, 2 * k + j // 8)],
                                             zero8), v16i) for k in range(4)]
                elif split:  # on the i32 lanes of two blocks (8 lanes each)
                    sc32 = b.zext(sm, v16i)
                    scale = [_pick(b, sc32, [2 * k + j // 8 for j in range(16)])
                             for k in range(4)]
                else:
                    scale = [_pick(b, sc16, [g] * (16 if busd or words else 32))
                             for g in range(8)]
                mn = b.zext(_pick(b, sm, [8 + j // 2 for j in range(16)]), v16i)
            else:
                d = irh._f16(b, p, 208)
                sc8 = _load(b, p, 192, _v(I8, 16))
                sc16 = b.sext(sc8, _v(I16, 16))
                if split:  # on the i32 lanes of 16 values (4 lanes each)
                    sc32 = b.sext(sc8, v16i)
                    scale = [_pick(b, sc32, [4 * k + j // 4 for j in range(16)])
                             for k in range(4)]
                else:  # words: lanes 0-7 of the even (odd) values are the block's first 16
                    scale = [_pick(b, sc16, [2 * g + j // (8 if busd or words else 16)
                                             for j in range(16 if busd or words else 32)])
                             for g in range(8)]
            if split and kind == "q4_k":
                codes = None
                w16 = None
            elif busd or split:
                codes = _codes(b, kind, p, signed=False)
                w16 = None
            elif words:  # several tokens share the codes; one token's are made per block
                w16 = [tuple(b.mul(c, scale[g]) for c in _code_words(b, kind, p, g))
                       for g in range(8)] if RT > 1 else None
            else:
                codes = [(b.zext if mins else b.sext)(c, _v(I16, 32))
                         for c in _codes(b, kind, p, signed=not mins)]
                w16 = [b.mul(codes[g], scale[g]) for g in range(8)]
            if split:  # 64 codes a vector, unsigned; q6_k's signed (q - 32) for the low bytes
                c8 = (_codes_pairs_q4k(b, p) if codes is None else
                      [_pick(b, codes[2 * k], range(64), codes[2 * k + 1]) for k in range(4)])
                cu = [b.bitcast(c, v16i) for c in c8]
                cs = cu if mins else [b.bitcast(b.sub(c, _c(_v(I8, 64), [32] * 64)), v16i)
                                      for c in c8]
            new = list(st)
            x0 = b.mul(sb, _i64(256 * AB))
            for s in range(RT):
                accs = [zero16] * NACC  # independent chains: a dot's latency, not its rate
                if busd:
                    for k in range(4):
                        xv = _load(b, xrow[s], b.add(x0, _i64(64 * k)), _v(I8, 64))
                        cv = _pick(b, codes[2 * k], range(64), codes[2 * k + 1])
                        p16 = b.call(mubs, [cv, xv])
                        sc2 = _pick(b, scale[2 * k], range(32), scale[2 * k + 1])
                        accs[k % NACC] = irh.vpdpwssd(b, accs[k % NACC], b.bitcast(p16, v16i),
                                                      b.bitcast(sc2, v16i))
                elif split:
                    for k in range(4):
                        lo, hi = (b.bitcast(_load(b, xrow[s], b.add(x0, _i64(256 * h + 64 * k)),
                                                  _v(I8, 64)), v16i) for h in range(2))
                        dot = b.call(dpb, [zero16, cu[k], hi])  # codes (u8) . high bytes (s8)
                        if pairs:  # (H << 16) + L, 0 <= L < 2^15: the pair (L, H)
                            dot = b.call(dpb, [b.shl(dot, _c(v16i, [16] * 16)), lo, cs[k]])
                            accs[0] = irh.vpdpwssd(b, accs[0], dot, scale[k])
                            continue
                        if not mins:  # q6_k: (q - 32) . hi, each lane its own 4 values'
                            dot = b.sub(dot, b.call(dpb, [zero16, c32, hi]))
                        dot = b.call(dpb, [b.shl(dot, _c(v16i, [8] * 16)), lo, cs[k]])
                        accs[k % NACC] = b.add(accs[k % NACC], b.mul(dot, scale[k]))
                elif words:  # lanes 0-7 the even values' pair sums, 8-15 the odd ones'
                    for g in range(8):
                        wg = w16[g] if w16 else [b.mul(c, scale[g])
                                                 for c in _code_words(b, kind, p, g)]
                        xe, xo = (_load(b, xrow[s], b.add(x0, _i64(AB * (32 * g + 16 * h))),
                                        _v(A, 16)) for h in range(2))
                        eo = _pick(b, _pair_dot(b, wg[0], xe), range(16), _pair_dot(b, wg[1], xo))
                        accs[g % NACC] = b.add(accs[g % NACC], eo)
                else:
                    for g in range(8):
                        xv = _load(b, xrow[s], b.add(x0, _i64(32 * AB * g)), _v(A, 32))
                        accs[g % NACC] = b.add(accs[g % NACC], _pair_dot(b, w16[g], xv))
                while len(accs) > 1:
                    accs = [b.add(accs[k], accs[k + 1]) for k in range(0, len(accs), 2)]
                acc = accs[0]
                bs = _load(b, brow[s], b.mul(sb, _i64(64)), v16i) if (mins or busd) else None
                if busd and not mins:  # q6_k's unsigned codes: 32 sum(sc_h xb_h) off
                    off = b.mul(b.sext(sc8, v16i), bs)
                    acc = b.sub(acc, b.shl(off, _c(v16i, [5] * 16)))
                dx = _load(b, drow[s], b.mul(sb, _i64(4)), F32)
                if mins:
                    f, fm = _f16_pair(b, p, dx)
                else:
                    f = _splat(b, b.fmul(d, dx, flags=FAST), 16)
                new[s] = b.fadd(new[s], b.fmul(b.sitofp(acc, v16f), f, flags=FAST), flags=FAST)
                if mins:
                    mv = b.sitofp(b.mul(mn, bs), v16f)
                    new[RT + s] = b.fadd(new[RT + s], b.fmul(mv, fm, flags=FAST), flags=FAST)
            return new

        init = [_c(v16f, [0.0] * 16)] * (RT * (2 if mins else 1))
        final = irh._loop(b, b.sdiv(xq.cols, _i64(256)), init, body)[0]
        for s in range(RT):
            v = irh._hsum(b, final[s])
            if mins:
                v = b.fsub(v, irh._hsum(b, final[RT + s]), flags=FAST)
            irh._store(b, out, toks[s], i, v)
        return ctx.get_dummy_value()

    return codegen
