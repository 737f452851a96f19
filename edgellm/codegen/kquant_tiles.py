"""Code generator of the integer-activation K-quant tiles: q4_k, q5_k, q6_k weights (ggml's
256-value super-blocks, as stored) x int16 (or int8) activation blocks of 32 (ActQ8).

A tile computes one weight row i times RT consecutive activation rows t.. over all K and
stores out[t + s, i]. `make_ktile(kind, RT)` makes the intrinsic
ktile_<kind>_1x<RT>(W, i, xq, xd, xds, t, out) (kquant_int.py calls them).

Per super-block (8 activation blocks g = 0..7 of 32 values, 16 half-blocks of 16):
  weights  the 8 blocks' codes as <32 x i8>: q4_k/q5_k unsigned q (0..15 / 0..31), q6_k
           q - 32 (signed); one vpmaddwd-style dot per block and token gives <8 x i32>
           whose lanes 0-3 sum the first 16 products and 4-7 the last 16
  reduce   two levels of pair sums (vphaddd) turn blocks 0-3 and 4-7 into two <8 x i32>
           of half-block sums: lane k = (block k, half 0), lane 4 + k = (block k, half 1)
  scale    each lane times d sc dx (float): q4_k/q5_k's 6-bit sc per block, q6_k's int8
           sc per half-block; dx the activation block's scale. Sums of 16 products fit a
           float exactly (|q| <= 32, |x| <= 32767: < 2^24)
  minima   q4_k/q5_k: sum_j (dmin m_j) xds_j, with xds = dx * (the block's sum of x),
           as one <8 x f32> multiply-add per super-block (value = d sc q - dmin m)
On AVX-512 VNNI with int16 activations each block's dot is one vpdpwssd (<16 x i32>) and
the reduce four levels of pair sums (_block_dot_wssd, _block_sums16): the same integers
(q4_k's codes widened 64 at a time, _codes16); with int8 activations two blocks' dot is one
vpdpbusd on the unsigned codes (_pair_dot_busd; q6_k's -32 a second one, its scales on the
i32 lanes), reduced the same way.
This is llama.cpp's q4_K x q8_K scheme (ggml-cpu's x86 quants.c) with ActQ8's blocks of 32
instead of q8_K's 256: one float scale per 32 activations, so the sc multiply is done in
float per lane instead of on the integer sums.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types

from ..runtime.simd import VNNI
from . import ir as irh
from .int8_tiles import GROUP, _q4_i16_vnni_group_codegen
from .ir import F32, FAST, I8, I16, I32, ORDERED, _c, _i64, _load, _pick, _splat, _v

__all__ = ["KQ_TYPES", "SUPER_BYTES", "make_ktile", "make_q5_group_tile"]

SUPER_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}
KQ_TYPES = ("q5_0", "q5_1", *SUPER_BYTES)
_MINS = ("q4_k", "q5_k")  # value d sc q - dmin m: the minimum's correction


def _splat8(b, v, n):
    return _c(_v(I8, n), [v] * n)


def _sc_min_bytes(b, p):
    """q4_k/q5_k: the 12 bytes at p + 4 -> <16 x i8>: lanes 0-7 the blocks' 6-bit scales,
    8-15 their minima (ggml's get_scale_min_k4), in vector operations on one 16-byte load
    (its last 4 bytes, the codes', unused): bytes 0-3 and 4-7 hold scales and minima 0-3 in
    their low 6 bits and the top 2 bits of 4-7's; bytes 8-11 the low 4 bits of 4-7's
    (scales low nibble, minima high). Two byte shuffles put each word's sources in its lane,
    then a shift, masks and an or a lane (was ~16 scalar operations and 3 inserts)."""
    u = _load(b, p, 4, _v(I8, 16))
    v4 = _v(I32, 4)
    low = b.bitcast(_pick(b, u, [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11]), v4)
    top = b.bitcast(_pick(b, u, [16] * 4 + [0, 1, 2, 3] + [16] * 4 + [4, 5, 6, 7],
                          _c(_v(I8, 16), [0] * 16)), v4)
    low = b.and_(b.lshr(low, _c(v4, [0, 0, 0, 4])),
                 _c(v4, [0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F]))
    top = b.and_(b.lshr(top, _c(v4, [2] * 4)), _c(v4, [0x30303030] * 4))
    return b.bitcast(b.or_(low, top), _v(I8, 16))


def _scales_k4(b, p):
    """q4_k/q5_k: the 12 bytes at p + 4 -> (<8 x f32> sc, <8 x f32> m)."""
    f = b.uitofp(_sc_min_bytes(b, p), _v(F32, 16))
    return _pick(b, f, range(8)), _pick(b, f, range(8, 16))


def _codes(b, kind, p, signed=True):
    """The super-block at p: 8 <32 x i8> code vectors, one per activation block (q6_k's
    q - 32, or q if not signed)."""
    low, four = _splat8(b, 15, 32), _splat8(b, 4, 32)
    if kind in _MINS:
        qs = 16 if kind == "q4_k" else 48
        qh = _load(b, p, 16, _v(I8, 32)) if kind == "q5_k" else None
        out = []
        for c in range(4):
            raw = _load(b, p, qs + 32 * c, _v(I8, 32))
            pair = [b.and_(raw, low), b.lshr(raw, four)]
            if qh is not None:
                for h in range(2):
                    bit = b.and_(b.lshr(qh, _splat8(b, 2 * c + h, 32)), _splat8(b, 1, 32))
                    pair[h] = b.or_(pair[h], b.shl(bit, four))
            out += pair
        return out
    three, off = _splat8(b, 3, 32), _splat8(b, 32, 32)
    out = []
    for h in range(2):
        ql0 = _load(b, p, 64 * h, _v(I8, 32))
        ql1 = _load(b, p, 64 * h + 32, _v(I8, 32))
        qh = _load(b, p, 128 + 32 * h, _v(I8, 32))
        for k, ql in enumerate((ql0, ql1, ql0, ql1)):
            nib = b.and_(ql, low) if k < 2 else b.lshr(ql, four)
            hi = b.and_(b.lshr(qh, _splat8(b, 2 * k, 32)), three)
            q = b.or_(nib, b.shl(hi, four))
            out.append(b.sub(q, off) if signed else q)
    return out


def _codes16(b, p):
    """q4_k's super-block at p as 8 <32 x i16> code vectors (int16 activations on VNNI):
    each 32 nibble bytes zero-extended once, then & 15 (block 2c) and >> 4 (block 2c + 1) on
    16-bit lanes: half the widening shuffles of widening each block's codes (the vector
    pipes, not memory, bound this tile). q5_k's fifth bits in 16-bit lanes cost what this
    saves: it widens each block's bytes."""
    v = _v(I16, 32)
    low, four = _c(v, [15] * 32), _c(v, [4] * 32)
    out = []
    for c in range(4):
        raw = b.zext(_load(b, p, 16 + 32 * c, _v(I8, 32)), v)
        out += [b.and_(raw, low), b.lshr(raw, four)]
    return out


def _block_dot(b, w, x, scale=None):
    """<32 x i8> codes w (signed if scale is given, then multiplied by the <32 x i16> scale
    first) . <32 x i8|i16> x -> <8 x i32>: the sign-extended product's pair sums (vpmaddwd
    on each 16-lane half), the halves added lane by lane."""
    n = 32
    if scale is None:
        w32 = b.zext(w, _v(I32, n))
    else:
        w32 = b.sext(b.mul(b.sext(w, _v(I16, n)), scale), _v(I32, n))
    p = b.mul(w32, b.sext(x, _v(I32, n)))
    p = b.add(_pick(b, p, range(0, n, 2)), _pick(b, p, range(1, n, 2)))
    return b.add(_pick(b, p, range(8)), _pick(b, p, range(8, 16)))


def _block_sums(b, dots):
    """8 <8 x i32> block dots -> one <8 x i32>, lane g = block g's sum (vphaddd tree)."""
    h = [irh._hadd(b, dots[k], dots[k + 1]) for k in range(0, 8, 2)]
    q0, q1 = irh._hadd(b, h[0], h[1]), irh._hadd(b, h[2], h[3])
    return b.add(_pick(b, q0, (0, 1, 2, 3, 8, 9, 10, 11), q1),
                 _pick(b, q0, (4, 5, 6, 7, 12, 13, 14, 15), q1))


def _block_dot_wssd(b, dpw, w, x, signed=False):
    """_block_dot on AVX-512 VNNI with int16 activations: the codes widened to 32 x i16
    (sign-extended if signed), one vpdpwssd -> <16 x i32> (lane j: products 2j, 2j + 1)."""
    v16i = _v(I32, 16)
    if w.type.element == I16:  # _codes16's, already widened
        w16 = w
    else:
        w16 = (b.sext if signed else b.zext)(w, _v(I16, 32))
    return b.call(dpw, [_c(v16i, [0] * 16), b.bitcast(w16, v16i), b.bitcast(x, v16i)])


def _pairs(b, u, v):
    """<16 x i32> u, v -> their lanes' pair sums, u's in lanes 0-7 and v's in 8-15."""
    even, odd = list(range(0, 32, 2)), list(range(1, 32, 2))
    return b.add(_pick(b, u, even, v), _pick(b, u, odd, v))


def _block_sums16(b, dots):
    """8 <16 x i32> block dots -> one <8 x i32>, lane g = block g's sum: four levels of pair
    sums (even | odd lanes of two vectors), each halving the lanes per block (or 4 vectors
    of two blocks, 8 lanes each, after the first level)."""
    while len(dots) > 1:
        dots = [_pairs(b, dots[k], dots[k + 1]) for k in range(0, len(dots), 2)]
    v = dots[0]  # lanes 2g, 2g + 1: block g
    return b.add(_pick(b, v, range(0, 16, 2)), _pick(b, v, range(1, 16, 2)))


def _pair_dot_busd(b, dpb, w0, w1, x, scale=None):
    """Two blocks' <32 x i8> unsigned codes w0, w1 . <64 x i8> activations x (the two
    blocks side by side) on AVX-512 VNNI: one vpdpbusd -> <16 x i32>, lanes 0-7 block 0 and
    8-15 block 1, each lane the sum of 4 products. With scale (q6_k: codes q = value + 32
    and <16 x i32> per-lane scales, a scale per 16 values) the 32 x sum(x) of each lane's
    4 values (a second vpdpbusd, 32 as the unsigned operand) is taken off, then the lane
    times its scale: |4 x 63 x 128 x 128| < 2^31."""
    v16i, zero = _v(I32, 16), _c(_v(I32, 16), [0] * 16)
    xv = b.bitcast(x, v16i)
    dot = b.call(dpb, [zero, b.bitcast(_pick(b, w0, range(64), w1), v16i), xv])
    if scale is None:
        return dot
    off = b.call(dpb, [zero, b.bitcast(_splat8(b, 32, 64), v16i), xv])
    return b.mul(b.sub(dot, off), scale)


def _operands(ctx, b, sig, args, RT):
    """A one-row tile's (W, block, i, xq, xd, xds, t, out) for RT tokens: (xq, out, i, t,
    A the activations' int type, AB its bytes, wssd: vpdpwssd (int16 activations on VNNI;
    the generic IR's dots lower to vpmaddwd), dpw: on VNNI vpdpwssd (int16) or vpdpbusd
    (int8), else None, W's row i, and each token's xq, xd and xds rows)."""
    w, xq, xd, xds, out = (irh._Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
    i, t = args[1], args[5]
    A = I16 if sig.args[2].dtype == types.int16 else I8
    wssd = VNNI and A == I16
    name = "vpdpwssd" if A == I16 else "vpdpbusd"
    dpw = (irh._llvm_fn(b, f"llvm.x86.avx512.{name}.512", _v(I32, 16), [_v(I32, 16)] * 3)
           if VNNI else None)
    wrow = w.row(i)
    xrow = [xq.row(b.add(t, _i64(s))) for s in range(RT)]
    drow = [xd.row(b.add(t, _i64(s))) for s in range(RT)]
    srow = [xds.row(b.add(t, _i64(s))) for s in range(RT)]
    return xq, out, i, t, A, A.width // 8, wssd, dpw, wrow, xrow, drow, srow


def _kq_codegen(kind, RT):
    SB = SUPER_BYTES[kind]
    mins = kind in _MINS
    v8 = _v(F32, 8)

    def codegen(ctx, b, sig, args):
        xq, out, i, t, A, AB, wssd, dpw, wrow, xrow, drow, srow = _operands(ctx, b, sig, args,
                                                                           RT)
        zero = _c(v8, [0.0] * 8)
        init = [zero] * (RT * (2 if mins else 1))
        busd = dpw is not None and A == I8

        def body(sb, st):
            p = b.gep(wrow, [b.mul(sb, _i64(SB))], inbounds=True)
            codes = (_codes16(b, p) if wssd and kind == "q4_k"
                     else _codes(b, kind, p, signed=not busd))
            if mins:
                d, dmin = irh._f16(b, p, 0), irh._f16(b, p, 2)
                sc8, m8 = _scales_k4(b, p)
                ws = b.fmul(sc8, _splat(b, d, 8), flags=FAST)  # lane g: d sc_g
                mw = b.fmul(m8, _splat(b, dmin, 8), flags=FAST)
                scales = [None] * 8
            elif busd or wssd:  # int8 scales per 16 values, on i32 lanes of 4 values
                ws = _splat(b, irh._f16(b, p, 208), 8)
                sc = b.sext(_load(b, p, 192, _v(I8, 16)), _v(I32, 16))
                scales = [_pick(b, sc, [4 * k + j // 4 for j in range(16)]) for k in range(4)]
            else:  # int8 scales per 16 values, applied to the codes (|q sc| <= 4096)
                ws = _splat(b, irh._f16(b, p, 208), 8)
                sc = b.sext(_load(b, p, 192, _v(I8, 16)), _v(I16, 16))
                scales = [_pick(b, sc, [2 * g] * 16 + [2 * g + 1] * 16) for g in range(8)]
            new = list(st)
            foff = b.mul(sb, _i64(32))  # 8 float scales per super-block
            x0 = b.mul(sb, _i64(256 * AB))
            for s in range(RT):
                if busd:  # blocks 2k and 2k + 1 in one vpdpbusd
                    xp = [_load(b, xrow[s], b.add(x0, _i64(64 * k)), _v(I8, 64))
                          for k in range(4)]
                    sums = _block_sums16(b, [_pair_dot_busd(b, dpw, codes[2 * k],
                                                            codes[2 * k + 1], xp[k],
                                                            None if mins else scales[k])
                                             for k in range(4)])
                else:
                    xs = [_load(b, xrow[s], b.add(x0, _i64(32 * AB * g)), _v(A, 32))
                          for g in range(8)]
                if wssd:  # q6_k's scales on the first level of pair sums (4 lanes a scale)
                    dots = [_block_dot_wssd(b, dpw, codes[g], xs[g], signed=not mins)
                            for g in range(8)]
                    pairs = [_pairs(b, dots[2 * k], dots[2 * k + 1]) for k in range(4)]
                    sums = _block_sums16(b, pairs if mins else
                                         [b.mul(pairs[k], scales[k]) for k in range(4)])
                elif not busd:
                    sums = _block_sums(b, [_block_dot(b, codes[g], xs[g], scales[g])
                                           for g in range(8)])
                f = b.fmul(ws, _load(b, drow[s], foff, v8), flags=FAST)
                new[s] = b.fadd(new[s], b.fmul(b.sitofp(sums, v8), f, flags=FAST), flags=FAST)
                if mins:
                    ds8 = _load(b, srow[s], foff, v8)
                    new[RT + s] = b.fadd(new[RT + s], b.fmul(mw, ds8, flags=FAST), flags=FAST)
            return new

        nsb = b.sdiv(xq.cols, _i64(256))
        final = irh._loop(b, nsb, init, body)[0]
        for s in range(RT):
            v = irh._hsum(b, final[s])
            if mins:
                v = b.fsub(v, irh._hsum(b, final[RT + s]), flags=FAST)
            irh._store(b, out, b.add(t, _i64(s)), i, v)
        return ctx.get_dummy_value()

    return codegen


def _q5_codes(b, p, h0):
    """A q5_0 / q5_1 block's 32 codes 0..31 (low nibbles, then high; qh bit j = element j's
    fifth bit) as <32 x i8>; p the block, h0 the offset of its qh word."""
    qs = _load(b, p, h0 + 4, _v(I8, 16))
    codes = _pick(b, b.and_(qs, _splat8(b, 15, 16)), range(32), b.lshr(qs, _splat8(b, 4, 16)))
    # bit j of the little-endian qh word, as a <32 x i1> mask (one kmovd on AVX-512)
    bits = b.bitcast(_load(b, p, h0, I32), ir.VectorType(ir.IntType(1), 32))
    return b.or_(codes, b.select(bits, _splat8(b, 16, 32), _splat8(b, 0, 32)))


def _q5_codegen(kind, RT):
    """q5_0 (value d (q - 16)) or q5_1 (d q + m) blocks of 32, G blocks per step:
    sum d (q - 16) dx x = d dx (q . x) - 16 d xds;  sum (d q + m) dx x = d dx (q . x) + m xds.
    On AVX-512 VNNI with int16 activations G = 8: one vpdpwssd per block, reduced as the
    super-block types' (_block_sums16) to a lane per block; elsewhere G = 4 (vpmaddwd,
    vphaddd). Blocks past the last G (K % 32 G) one at a time, their dots summed as
    vectors (one horizontal sum at the end). Float work in the order written (ORDERED, no
    reassoc): a row's sum is then the same wherever LLVM inlines the tile (decode's serial
    rows, the parallel chunks), on every CPU's cost model."""
    one = kind == "q5_1"
    BB, h0 = (24, 4) if one else (22, 2)
    v8 = _v(F32, 8)

    def codegen(ctx, b, sig, args):
        xq, out, i, t, A, AB, wssd, dpw, wrow, xrow, drow, srow = _operands(ctx, b, sig, args,
                                                                           RT)
        G = 8 if wssd else 4
        vG = _v(F32, G)
        nb = b.sdiv(xq.cols, _i64(32))

        def gather(ps, off):
            v = ir.Constant(_v(I16, G), ir.Undefined)
            for g, p in enumerate(ps):
                v = b.insert_element(v, _load(b, p, off, I16), _c(I32, g))
            return irh._h2f(b, v)

        def body(k, st):
            ps = [b.gep(wrow, [b.mul(b.add(b.mul(k, _i64(G)), _i64(g)), _i64(BB))],
                        inbounds=True) for g in range(G)]
            codes = [_q5_codes(b, p, h0) for p in ps]
            dG = gather(ps, 0)
            fm = gather(ps, 2) if one else dG
            new = list(st)
            for s in range(RT):
                x0 = b.mul(k, _i64(32 * G * AB))
                xs = [_load(b, xrow[s], b.add(x0, _i64(32 * AB * g)), _v(A, 32))
                      for g in range(G)]
                foff = b.mul(k, _i64(4 * G))
                f = b.fmul(dG, _load(b, drow[s], foff, vG), flags=ORDERED)
                if wssd:  # lane g: block g
                    q = _block_sums16(b, [_block_dot_wssd(b, dpw, codes[g], xs[g])
                                          for g in range(G)])
                else:  # lanes g and 4 + g: block g's halves
                    dots = [_block_dot(b, codes[g], xs[g]) for g in range(G)]
                    q = irh._hadd(b, irh._hadd(b, dots[0], dots[1]), irh._hadd(b, dots[2], dots[3]))
                    f = _pick(b, f, (0, 1, 2, 3, 0, 1, 2, 3))
                new[s] = b.fadd(new[s], b.fmul(b.sitofp(q, v8), f, flags=ORDERED), flags=ORDERED)
                new[RT + s] = b.fadd(new[RT + s], b.fmul(fm, _load(b, srow[s], foff, vG),
                                                         flags=ORDERED), flags=ORDERED)
            return new

        init = [_c(v8, [0.0] * 8)] * RT + [_c(vG, [0.0] * G)] * RT
        st = irh._loop(b, b.sdiv(nb, _i64(G)), init, body)[0]
        res = []
        for s in range(RT):
            fix = irh._hsum(b, st[RT + s], ORDERED)
            if not one:
                fix = b.fmul(fix, _c(F32, -16.0), flags=ORDERED)
            res.append(b.fadd(irh._hsum(b, st[s], ORDERED), fix, flags=ORDERED))

        vt = _v(F32, 16 if wssd else 8)

        def tail(bi, st):  # st: RT float sums of the minima, then RT vectors of the dots
            p = b.gep(wrow, [b.mul(bi, _i64(BB))], inbounds=True)
            codes = _q5_codes(b, p, h0)
            d = irh._f16(b, p, 0)
            fm = irh._f16(b, p, 2) if one else b.fmul(d, _c(F32, -16.0), flags=ORDERED)
            new = list(st)
            for s in range(RT):
                x = _load(b, xrow[s], b.mul(bi, _i64(32 * AB)), _v(A, 32))
                dot = _block_dot_wssd(b, dpw, codes, x) if wssd else _block_dot(b, codes, x)
                dx = _load(b, drow[s], b.mul(bi, _i64(4)), F32)
                ds = _load(b, srow[s], b.mul(bi, _i64(4)), F32)
                new[s] = b.fadd(st[s], b.fmul(fm, ds, flags=ORDERED), flags=ORDERED)
                new[RT + s] = b.fadd(st[RT + s], b.fmul(b.sitofp(dot, vt), _splat(
                    b, b.fmul(d, dx, flags=ORDERED), vt.count), flags=ORDERED), flags=ORDERED)
            return new

        res = irh._for(b, b.mul(b.sdiv(nb, _i64(G)), _i64(G)), nb,
                   res + [_c(vt, [0.0] * vt.count)] * RT, tail)
        res = [b.fadd(res[s], irh._hsum(b, res[RT + s], ORDERED), flags=ORDERED) for s in range(RT)]
        for s in range(RT):
            irh._store(b, out, b.add(t, _i64(s)), i, res[s])
        return ctx.get_dummy_value()

    return codegen


def make_ktile(kind, RT):
    """The intrinsic ktile_<kind>_1x<RT>(W, block, i, xq, xd, xds, t, out): out[t + s, i] =
    W[i] . x[t + s] for s < RT (block is ignored: the type fixes it), xq int8 or int16.
    q4_k, q5_k, q6_k also take super-block activations (act_quant_k's ActK): xd a scale per
    256 and, for xds, int32 sums per 16 (their dtype picks kquant_k_tiles.py's code)."""
    arrays = {0: types.uint8, 3: (types.int8, types.int16), 4: types.float32, 5: types.float32,
              7: types.float32}
    if kind in ("q5_0", "q5_1"):
        gen = _q5_codegen(kind, RT)
    else:
        from .kquant_k_tiles import kk_codegen  # it builds on this module's helpers

        blocks, supers = _kq_codegen(kind, RT), kk_codegen(kind, RT)
        arrays[5] = (types.float32, types.int32)

        def gen(ctx, b, sig, args):
            return (supers if sig.args[4].dtype == types.int32 else blocks)(ctx, b, sig, args)
    return irh._typed(f"ktile_{kind}_1x{RT}", irh._drop_block(gen), arrays, ints=(1, 2, 6))


def make_q5_group_tile(kind):
    """The intrinsic tile_<kind>_8x1(W, block, i, xq, xd, xds, t, out) for q5_0 / q5_1:
    out[t, i + r] = W[i + r] . x[t] for r < 8 (block is ignored). On AVX-512 VNNI with int16
    activations the q4 row group's tile with the fifth bits (codegen_int8: per block one
    vector of float work for the 8 rows, where the 1x1 tile did that work per row); elsewhere
    the 1x1 tile row by row."""
    group = irh._drop_block(_q4_i16_vnni_group_codegen(kind, 1))
    one = irh._drop_block(_q5_codegen(kind, 1))

    def codegen(ctx, b, sig, args):
        if VNNI and sig.args[3].dtype == types.int16:
            return group(ctx, b, sig, args)
        for r in range(GROUP):
            one(ctx, b, sig, [*args[:2], b.add(args[2], _i64(r)), *args[3:]])
        return ctx.get_dummy_value()

    arrays = {0: types.uint8, 3: (types.int8, types.int16), 4: types.float32, 5: types.float32,
              7: types.float32}
    return irh._typed(f"tile_{kind}_8x1", codegen, arrays, ints=(1, 2, 6))
