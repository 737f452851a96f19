"""Code generators of the int8-activation tiles: quantized weights x int8 activation blocks.

Each codegen computes a tile of outputs, RW consecutive weight rows i.. times RT
consecutive activation rows t.., over all K columns, and stores them to out[t + s, i + r].
`make_tile(kind, RW, RT)` makes the intrinsic (tiles.py names them).

Row groups (B = 32): the 8x1 tile (decode) reduces the 8 rows' int8 dot products of a
block to one <8 x i32> (vphaddd), so scales, offsets and the multiply-add are done once per
block for 8 rows as vectors; it prefetches the next group's bytes (8 rows side by side
are 8 streams the hardware prefetcher follows badly). See _group_codegen. Prefill packs
row groups into panels instead (panel.py), where no horizontal sums are needed.

Activation side (blocks of 32): xq int8 [T, K], xd float32 [T, K/32] scales,
xds float32 [T, K/32] = xd * (sum of the block's xq) (ggml's q8_1 "s"). With it the q4_0
offset and the q4_1 minimum cost one multiply-add per block and row:
  q4_0: sum_j d(q_j - 8) dx x_j = d dx (q . x) - 8 d xds
  q4_1: sum_j (d q_j + m) dx x_j = d dx (q . x) + m xds
Block sizes 64 and 128 reuse the 32-element activation blocks: a weight block's scale
multiplies the sum over its 2 or 4 activation sub-blocks, each with its own dx.

int16 activations (xq int16, the same blocks and scales; the default decode step's): the
same codegens with A = I16. Their dot products never take vpdpbusd (u8 x s8 only): the
generic sext/zext-multiply-pair-add IR, which x86 lowers to vpmaddwd (i16 x i16 -> i32),
the instruction the portable int8 path ends in as well, so on AVX2 they cost about what
int8 ones do. Sums fit in i32: |w| <= 128, |x| <= 32767, 32 products per block.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types

from ..modelfile import quant
from ..runtime.simd import VNNI
from .ir import (
    BYTES,
    F32,
    FAST,
    I8,
    I16,
    I32,
    ORDERED,
    _c,
    _dot_acc,
    _f16,
    _for,
    _h2f,
    _hadd,
    _hsum,
    _i64,
    _llvm_fn,
    _load,
    _loop,
    _nibbles,
    _pair16,
    _pick,
    _prefetch_ahead,
    _Rows,
    _signed_dot,
    _signed_dot_halves,
    _splat,
    _splat_f16,
    _store,
    _typed,
    _v,
)
from .packing import PACKING, affine, block_layout, by_block_of, signed, weight_dot, weights, zero

__all__ = ["GROUP", "group_blocks", "make_tile", "scale_block"]

GROUP = 8  # weight rows of a row-group tile (B = 32)
PF_ROWS = 2  # prefetch distance of the q8_0 multi-row tile, in tiles
PF_GROUPS = 2  # prefetch distance of the row-group tiles, in groups (one group ahead was slower from DRAM)
# the output lane of each row after _group_reduce: pairs of rows share a vector
_PAIR_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _group_layout(kind):
    """The int16 VNNI row group's block layout of a 4- or 5-bit type of blocks of 32, from its
    quant.TYPES row: (bytes a block, offset of the 16 nibble bytes, offset of q5's u32 fifth
    bits or None): the f16 scale (and minimum), [the fifth bits], the nibbles."""
    t = quant.TYPES[kind]
    five = t.bits == 5
    return t.block_bytes(32), t.header_bytes + (4 if five else 0), t.header_bytes if five else None


def _q8act_codegen(kind, B, RW, RT, A=I8):
    """Tile codegen for int8 (A = I8) or int16 (A = I16) activations.

    The loop works on 64 columns per dot product (vpdpbusd on 512 bits): two activation
    blocks, from two weight blocks (B = 32), one (B = 64) or half of one (B = 128). The
    per-block scales travel as pairs: sum += dot_lanes * (dw dx) with lanes 0-7 of the
    first block and 8-15 of the second. With B = 32 an odd block count leaves one block,
    done at the end on 256 bits.
    """
    hdr, BB = block_layout(kind, B)
    E = max(64, B)  # columns per loop step
    NW = E // B  # weight blocks per step
    U = E // 64  # 64-column units per step
    q4 = not signed(kind)
    AB = A.width // 8  # bytes per activation value

    def units(b, p):
        """The weight step at p: [(<64 x i8> weights, <2 x f32> scales, <2 x f32> minima)]."""
        if B == 32:
            p1 = b.gep(p, [_i64(BB)], inbounds=True)
            h = [_load(b, q, 0, I16) for q in (p, p1)]
            d2 = _pair16(b, h[0], h[1])
            m2 = _pair16(b, _load(b, p, 2, I16), _load(b, p1, 2, I16)) if affine(kind) else None
            if signed(kind):
                w = _pick(b, weights(b, kind, p), range(64), weights(b, kind, p1))
            else:
                raw = _pick(b, _load(b, p, hdr, _v(I8, 16)), range(32),
                            _load(b, p1, hdr, _v(I8, 16)))
                lo = b.and_(raw, _c(_v(I8, 32), [15] * 32))
                hi = b.lshr(raw, _c(_v(I8, 32), [4] * 32))
                order = [*range(16), *range(32, 48), *range(16, 32), *range(48, 64)]
                w = _pick(b, lo, order, hi)
            return [(w, d2, m2)]
        d2 = _splat(b, _f16(b, p, 0), 2)
        m2 = _splat(b, _f16(b, p, 2), 2) if affine(kind) else None
        if signed(kind):  # blocks of 64 and 128: int8 bytes (a table type has blocks of 32)
            assert PACKING[kind].codes == "int8"
            ws = [_load(b, p, 2 + 64 * h, _v(I8, 64)) for h in range(U)]
        else:
            full = _nibbles(b, p, hdr, B)
            ws = [full] if B == 64 else [_pick(b, full, range(64 * h, 64 * h + 64))
                                         for h in range(U)]
        return [(w, d2, m2) for w in ws]

    def codegen(ctx, b, sig, args):
        w, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
        i, t = args[1], args[5]
        K = xq.cols
        wrow = [w.row(b.add(i, _i64(r))) for r in range(RW)]
        xrow = [xq.row(b.add(t, _i64(r))) for r in range(RT)]
        drow = [xd.row(b.add(t, _i64(r))) for r in range(RT)]
        srow = [xds.row(b.add(t, _i64(r))) for r in range(RT)]
        n = RW * RT
        init = [_c(_v(F32, 16), [0.0] * 16)] * n + ([_c(_v(F32, 2), [0.0] * 2)] * n if q4 else [])
        expand = [0] * 8 + [1] * 8

        def body(k, st):
            acc, fix = list(st[:n]), list(st[n:])
            a0 = b.mul(k, _i64(E // 32))  # first activation block of the step
            ablk = [b.add(a0, _i64(2 * h)) for h in range(U)]
            # activation side, shared by the RW rows: int8 vectors, scales as 16 lanes
            xs = [[_load(b, xrow[s], b.mul(a, _i64(32 * AB)), _v(A, 64)) for a in ablk]
                  for s in range(RT)]
            dx = [[_pick(b, _load(b, drow[s], b.mul(a, _i64(4)), _v(F32, 2)), expand)
                   for a in ablk] for s in range(RT)]
            ds = [[_load(b, srow[s], b.mul(a, _i64(4)), _v(F32, 2)) if q4 else None
                   for a in ablk] for s in range(RT)]
            for r in range(RW):
                us = units(b, b.gep(wrow[r], [b.mul(k, _i64(NW * BB))], inbounds=True))
                for h, (wv, d2, m2) in enumerate(us):
                    dot = weight_dot(b, kind, wv)
                    dw = _pick(b, d2, expand)  # shared by the RT tokens
                    for s in range(RT):
                        j = r * RT + s
                        f = b.fmul(b.sitofp(dot(xs[s][h]), _v(F32, 16)), dx[s][h], flags=FAST)
                        acc[j] = b.fadd(acc[j], b.fmul(f, dw, flags=FAST), flags=FAST)
                        if q4:
                            fm = m2 if affine(kind) else d2
                            fix[j] = b.fadd(fix[j], b.fmul(fm, ds[s][h], flags=FAST),
                                            flags=FAST)
            return acc + fix

        nstep = b.sdiv(K, _i64(E))
        states = _loop(b, nstep, init, body, unroll=2 if n == 1 else 1)
        final = states[0]
        for st in states[1:]:
            final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
        res = []
        for j in range(n):
            v = _hsum(b, final[j])
            if q4:
                f = b.fadd(b.extract_element(final[n + j], _c(I32, 0)),
                           b.extract_element(final[n + j], _c(I32, 1)), flags=FAST)
                if zero(kind):
                    f = b.fmul(f, _c(F32, -float(zero(kind))), flags=FAST)
                v = b.fadd(v, f, flags=FAST)
            res.append(v)
        if B == 32:  # the last block when K / 32 is odd
            res = _for(b, b.mul(nstep, _i64(2)), b.sdiv(K, _i64(32)), res,
                       lambda bi, st: _last_block(b, kind, bi, wrow, xrow, drow, srow, st, RT,
                                                  A))
        for r in range(RW):
            for s in range(RT):
                _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)), res[r * RT + s])
        return ctx.get_dummy_value()

    return codegen



def _tile_rows(ctx, b, sig, args, RW, RT):
    """A tile intrinsic's arguments (W, i, xq, xd, xds, t, out; block dropped) as byte rows:
    (w, xq, out, i, t, W's rows i..i+RW-1, and the RT tokens' xq, xd, xds rows from t)."""
    w, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
    i, t = args[1], args[5]
    toks = [b.add(t, _i64(s)) for s in range(RT)]
    return (w, xq, out, i, t, [w.row(b.add(i, _i64(r))) for r in range(RW)],
            [xq.row(u) for u in toks], [xd.row(u) for u in toks], [xds.row(u) for u in toks])


def _q8act_row_codegen(kind, RW=1, A=I8, RT=1):
    """Tile codegen for RW weight rows (RW > 1: q8_0 only) x one token, B = 32, on 256 bits
    per block.

    With nothing to share between rows or tokens, the 64-column units of _q8act_codegen
    lose to this: their 512-bit ops take two cycles each on Zen 4, against a scalar
    dw * dx broadcast over 8 lanes per block here (notes/qmv_sketch.py's scheme).
    q8_0 on VNNI with RW > 1: the rows share the activation block and its -128 sum(x) (one
    vpdpbusd per block), and each row's dot is (w + 128) . x from there: one xor per row
    instead of the |w| . sign(w) x trick's three operations. The lane sums are the same
    integers either way, so the results are too. q8_0 elsewhere (int16 activations, AVX2):
    dw dx as a vector, dx broadcast once for the rows and dw straight from its f16 bits
    (`halves`, below): the same roundings as the scalar dw dx, so the same results.
    RT > 1 (q8_0, the batched step's tiles): RT tokens, each with the one-token tile's
    operations in its order (its results bit for bit), the weights loaded once.
    """
    hdr, BB = block_layout(kind)
    q4 = not signed(kind)
    assert (RW == 1 and RT == 1) or not q4
    flip_trick = VNNI and RW > 1 and A == I8
    # q8_0 off vpdpbusd (int16 activations, or AVX2): the halves grouping of the products,
    # and per row and block a vpbroadcastw + vcvtph2ps of the scale instead of a scalar
    # f16 load, convert, dw dx multiply and broadcast (fewer operations a block; measured
    # faster from L2)
    halves = signed(kind) and not (VNNI and A == I8)
    # q8_0 on VNNI with int16 activations: one vpdpwssd per block into 16 lanes, kept as 16
    # float lanes (no halves add: 8 operations a row and block instead of 10)
    wide = halves and VNNI and A == I16
    AB = A.width // 8
    L = 16 if wide else 8  # float lanes of the sums
    vf = _v(F32, L)
    v16i = _v(I32, 16)

    def codegen(ctx, b, sig, args):
        w, xq, out, i, t, wrows, xrows, drows, srows = _tile_rows(ctx, b, sig, args, RW, RT)
        toks = [b.add(t, _i64(s)) for s in range(RT)]
        n = RW * RT
        init = [_c(vf, [0.0] * L)] * n + ([_c(F32, 0.0)] if q4 else [])
        dpw = _llvm_fn(b, "llvm.x86.avx512.vpdpwssd.512", v16i, [v16i] * 3) if wide else None
        zero_i = _c(_v(I32, 8), [0] * 8)
        flip = _c(_v(I8, 32), [-128] * 32)
        nxt = w.row(b.add(i, _i64(PF_ROWS * RW)))  # the rows PF_ROWS tiles ahead

        def body(bi, st):
            xs = [_load(b, xr, b.mul(bi, _i64(32 * AB)), _v(A, 32)) for xr in xrows]
            dxs = [_load(b, dr, b.mul(bi, _i64(4)), F32) for dr in drows]
            if RW > 1:
                _prefetch_ahead(b, nxt, bi, RW * BB)
            if flip_trick:
                biases = [b.sub(zero_i, _dot_acc(b, zero_i, flip, x)) for x in xs]
            if halves:
                dxvs = [_splat(b, dx, L) for dx in dxs]  # shared by the rows
            out = [None] * n
            for r in range(RW):
                p = b.gep(wrows[r], [b.mul(bi, _i64(BB))], inbounds=True)
                if wide:
                    w16 = b.bitcast(b.sext(weights(b, kind, p), _v(I16, 32)), v16i)
                    dwv = _splat_f16(b, p, 0, L)

                    def dotw(x, w16=w16):
                        return b.call(dpw, [_c(v16i, [0] * 16), w16, b.bitcast(x, v16i)])
                elif halves:  # the same dw dx, dw broadcast from its f16 bits
                    dotw = _signed_dot_halves(b, weights(b, kind, p))
                    dwv = _splat_f16(b, p, 0, 8)
                else:
                    dw = _f16(b, p, 0)
                    if flip_trick:
                        wu = b.xor(weights(b, kind, p), flip)
                    else:
                        wv = weights(b, kind, p) if not q4 else _nibbles(b, p, hdr, 32)
                        dotw = weight_dot(b, kind, wv)
                for s in range(RT):
                    if halves:
                        dot = dotw(xs[s])
                        scale = b.fmul(dwv, dxvs[s], flags=ORDERED)
                    else:
                        dot = (_dot_acc(b, biases[s], wu, xs[s]) if flip_trick
                               else dotw(xs[s]))
                        scale = _splat(b, b.fmul(dw, dxs[s], flags=ORDERED), 8)
                    j = r * RT + s
                    out[j] = b.fadd(st[j], b.fmul(b.sitofp(dot, vf), scale, flags=ORDERED),
                                    flags=ORDERED)
            if q4:  # RW == RT == 1: p and dw are the row's
                fm = _f16(b, p, 2) if affine(kind) else dw
                ds = _load(b, srows[0], b.mul(bi, _i64(4)), F32)
                out.append(b.fadd(st[n], b.fmul(fm, ds, flags=ORDERED), flags=ORDERED))
            return out

        states = _loop(b, b.sdiv(xq.cols, _i64(32)), init, body, unroll=2)
        for r in range(RW):
            for s in range(RT):
                j = r * RT + s
                res = b.fadd(_hsum(b, states[0][j], ORDERED), _hsum(b, states[1][j], ORDERED),
                             flags=ORDERED)
                if q4:
                    fix = b.fadd(states[0][n], states[1][n], flags=ORDERED)
                    if zero(kind):
                        fix = b.fmul(fix, _c(F32, -float(zero(kind))), flags=ORDERED)
                    res = b.fadd(res, fix, flags=ORDERED)
                _store(b, out, toks[s], b.add(i, _i64(r)), res)
        return ctx.get_dummy_value()

    return codegen



def _q4_i16_row_codegen(kind, RW, RT=1, chains=None):
    """Tile codegen for RW q4_0/q4_1 weight rows x RT tokens of int16 activations, B = 32,
    where the dot products are not VNNI's (AVX2's vpmaddwd; the portable path).

    Built to spend few shuffle uops, the port the row-group tile runs out of on AVX2 (its
    8-row scale gathers and vphaddd trees). Per row and block: the 16 nibble bytes
    zero-extended to 16 x i16 once (elements j and 16 + j share lane j: & 15 gives the
    first 16, >> 4 the last 16; shared by the RT tokens), two vpmaddwd against the
    activation's halves and a vpaddd; the scale broadcast straight from the block's f16
    (vpbroadcastw + vcvtph2ps). q4_0's offset joins the same 8 lanes, an eighth per lane
    (the lanes are summed at the end): acc += dw (dx P - xds), with P the block's lane sums
    as floats and xds = dx sum(x) (module docstring); q4_1's minimum goes to a scalar per
    row, fix += m xds, which measured faster than a second broadcast.
    Each (row, token) sum takes the same operations in the same order whatever RW and RT
    are, in `chains` chains (default: two for one row, else one), so a tile of several
    tokens gives each token the one-token tile's result bit for bit (the batched step).
    """
    hdr, BB = block_layout(kind)
    v8, i16x16 = _v(F32, 8), _v(I16, 16)
    n = RW * RT

    def madd(b, w, x):
        p = b.mul(b.sext(w, _v(I32, 16)), b.sext(x, _v(I32, 16)))
        return b.add(_pick(b, p, range(0, 16, 2)), _pick(b, p, range(1, 16, 2)))

    def codegen(ctx, b, sig, args):
        w, xq, out, i, t, wrows, xrows, drows, srows = _tile_rows(ctx, b, sig, args, RW, RT)
        nxt = w.row(b.add(i, _i64(PF_ROWS * RW)))
        low = _c(i16x16, [15] * 16)
        four = _c(i16x16, [4] * 16)

        def body(bi, st):
            xo, fo = b.mul(bi, _i64(64)), b.mul(bi, _i64(4))
            tok = []
            for s in range(RT):
                x0 = _load(b, xrows[s], xo, i16x16)
                x1 = _load(b, xrows[s], b.add(xo, _i64(32)), i16x16)
                dx = _splat(b, _load(b, drows[s], fo, F32), 8)
                xs = _load(b, srows[s], fo, F32)
                # q4_0's offset: -zero xs dw over the 8 lanes, an eighth each
                z8 = zero(kind) / 8
                c = _splat(b, b.fsub(_c(F32, 0.0), xs, flags=FAST) if z8 == 1
                           else b.fmul(xs, _c(F32, -z8), flags=FAST), 8)
                tok.append((x0, x1, dx, xs, c))
            if RW > 1:
                _prefetch_ahead(b, nxt, bi, RW * BB)
            new, fix = [], []
            for r in range(RW):
                p = b.gep(wrows[r], [b.mul(bi, _i64(BB))], inbounds=True)
                q = b.zext(_load(b, p, hdr, _v(I8, 16)), i16x16)
                lo, hi = b.and_(q, low), b.lshr(q, four)
                dw = _splat_f16(b, p, 0, 8)
                m = _f16(b, p, 2) if affine(kind) else None
                for s, (x0, x1, dx, xs, c) in enumerate(tok):
                    j = r * RT + s
                    f = b.sitofp(b.add(madd(b, lo, x0), madd(b, hi, x1)), v8)
                    if not affine(kind):
                        f = b.fadd(b.fmul(f, dx, flags=FAST), c, flags=FAST)
                        new.append(b.fadd(st[j], b.fmul(f, dw, flags=FAST), flags=FAST))
                    else:
                        new.append(b.fadd(st[j], b.fmul(b.fmul(f, dx, flags=FAST), dw,
                                                        flags=FAST), flags=FAST))
                        fix.append(b.fadd(st[n + j], b.fmul(m, xs, flags=FAST), flags=FAST))
            return new + fix

        init = [_c(v8, [0.0] * 8)] * n + ([_c(F32, 0.0)] * n if affine(kind) else [])
        unroll = chains or (2 if n == 1 else 1)
        states = _loop(b, b.sdiv(xq.cols, _i64(32)), init, body, unroll=unroll)
        final = states[0]
        for st in states[1:]:
            final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
        for r in range(RW):
            for s in range(RT):
                j = r * RT + s
                res = _hsum(b, final[j])
                if affine(kind):
                    res = b.fadd(res, final[n + j], flags=FAST)
                _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)), res)
        return ctx.get_dummy_value()

    return codegen


def _rows_of(codegen, R, n):
    """An R-row tile as R / n tiles of n rows, one after the other."""
    def run(ctx, b, sig, args):
        for r in range(0, R, n):
            codegen(ctx, b, sig, [*args[:1], b.add(args[1], _i64(r)), *args[2:]])
        return ctx.get_dummy_value()
    return run


def group_blocks(b, nblocks, RT, body, out, t, i, order, chains=None):
    """Run body(block, acc) over the blocks with RT <len(order) x f32> accumulators (in
    `chains` chains; default two when RT == 1, else one), then store lane k of token s's
    sum to out[t + s, i + order[k]]."""
    L = len(order)
    init = [_c(_v(F32, L), [0.0] * L)] * RT
    states = _loop(b, nblocks, init, body, unroll=chains or (2 if RT == 1 else 1))
    final = states[0]
    for st in states[1:]:
        final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
    for s in range(RT):
        for lane, r in enumerate(order):
            _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)),
                   b.extract_element(final[s], _c(I32, lane)))


def scale_block(b, kind, tot, drow, srow, foff, dw, mw, acc):
    """acc + one block's <8 x i32> int8 dot products `tot` (a lane per weight row) as floats:
    tot dx dw, minus 8 dw xds (q4_0) or plus mw xds (q4_1); dx and xds at byte offset foff
    of the activation rows drow, srow; dw, mw <8 x f32>. The row-group and panel tiles' float
    work per block, in this order in both (interleave.py's tiles: as this compiles)."""
    v8 = _v(F32, 8)
    dx = _splat(b, _load(b, drow, foff, F32), 8)
    f = b.fmul(b.sitofp(tot, v8), dx, flags=FAST)
    if zero(kind):
        ds = _load(b, srow, foff, F32)
        f = b.fadd(f, _splat(b, b.fmul(ds, _c(F32, -float(zero(kind))), flags=FAST), 8),
                   flags=FAST)
    acc = b.fadd(acc, b.fmul(f, dw, flags=FAST), flags=FAST)
    if affine(kind):
        ds = _splat(b, _load(b, srow, foff, F32), 8)
        acc = b.fadd(acc, b.fmul(mw, ds, flags=FAST), flags=FAST)
    return acc



def _group_codegen(kind, RT, A=I8, chains=None):
    """Tile codegen for GROUP weight rows x RT tokens, B = 32: one vector per block.
    chains=2 with RT > 1: each token's sums are added in the order of the RT = 1 tile's
    (group_blocks), so they are its results bit for bit (the batched decode step's tiles).

    Per block the int8 dot products of all rows are reduced to one <8 x i32> (one lane a
    row), so the per-block float work (scales, the q4 offset, the multiply-add) is done
    once for the 8 rows as vectors, not once per row. q4: two rows share a 256-bit
    vector ([row a's 16 nibble bytes | row b's]), low nibbles against the activation's
    first 16 values broadcast to both halves and high nibbles against its last 16, so each
    row's sum sits in 4 lanes; q8_0: one row per vector, on VNNI as (w + 128) . x (the
    weights made unsigned by one xor per row, shared by the tokens) with each sum started
    at -128 sum(x) (one vpdpbusd per token): exactly w . x in the integers.
    """
    hdr, BB = block_layout(kind)
    R = GROUP
    q4 = not signed(kind)
    order = _PAIR_ORDER if q4 else tuple(range(R))
    AB = A.width // 8

    def codegen(ctx, b, sig, args):
        w, xq, out, i, t, wrow, xrow, drow, srow = _tile_rows(ctx, b, sig, args, R, RT)
        zero_i = _c(_v(I32, 8), [0] * 8)
        low16 = _c(_v(I8, 32), [15] * 32)
        four = _c(_v(I8, 32), [4] * 32)
        flip = _c(_v(I8, 32), [-128] * 32)

        def gather16(ps, off):
            v = ir.Constant(_v(I16, R), ir.Undefined)
            for lane, r in enumerate(order):
                v = b.insert_element(v, _load(b, ps[r], off, I16), _c(I32, lane))
            return _h2f(b, v)

        nxt = w.row(b.add(i, _i64(PF_GROUPS * R)))  # the rows PF_GROUPS groups ahead

        def body(bi, st):
            ps = [b.gep(row, [b.mul(bi, _i64(BB))], inbounds=True) for row in wrow]
            _prefetch_ahead(b, nxt, bi, R * BB)
            xoff = b.mul(bi, _i64(32 * AB))
            foff = b.mul(bi, _i64(4))
            dots = [[] for _ in range(RT)]
            if q4:
                xs = []
                for s in range(RT):
                    xl = _load(b, xrow[s], xoff, _v(A, 16))
                    xh = _load(b, xrow[s], b.add(xoff, _i64(16 * AB)), _v(A, 16))
                    xs.append((_pick(b, xl, list(range(16)) * 2),
                               _pick(b, xh, list(range(16)) * 2)))
                for r in range(0, R, 2):
                    raw = _pick(b, _load(b, ps[r], hdr, _v(I8, 16)), range(32),
                                _load(b, ps[r + 1], hdr, _v(I8, 16)))
                    lo = b.and_(raw, low16)
                    hi = b.lshr(raw, four)
                    for s in range(RT):
                        dots[s].append(_dot_acc(b, _dot_acc(b, zero_i, lo, xs[s][0]), hi,
                                                xs[s][1]))
            elif VNNI and A == I8:  # (w + 128) . x - 128 sum(x), which starts each sum
                xs = [_load(b, xrow[s], xoff, _v(I8, 32)) for s in range(RT)]
                bias = [b.sub(zero_i, _dot_acc(b, zero_i, flip, x)) for x in xs]
                for r in range(R):
                    wu = b.xor(weights(b, kind, ps[r]), flip)
                    for s in range(RT):
                        dots[s].append(_dot_acc(b, bias[s], wu, xs[s]))
            else:
                xs = [_load(b, xrow[s], xoff, _v(A, 32)) for s in range(RT)]
                for r in range(R):
                    dot = _signed_dot(b, weights(b, kind, ps[r]))
                    for s in range(RT):
                        dots[s].append(dot(xs[s]))
            dw = gather16(ps, 0)
            mw = gather16(ps, 2) if affine(kind) else None
            new = []
            for s in range(RT):
                d = dots[s]
                while len(d) > 2:
                    d = [_hadd(b, d[k], d[k + 1]) for k in range(0, len(d), 2)]
                if q4:
                    tot = _hadd(b, d[0], d[1])  # lanes: rows in `order`
                else:  # d[0] lanes: rows 0-3 low half, 0-3 high half: add the halves
                    tot = b.add(_pick(b, d[0], (0, 1, 2, 3, 8, 9, 10, 11), d[1]),
                                _pick(b, d[0], (4, 5, 6, 7, 12, 13, 14, 15), d[1]))
                new.append(scale_block(b, kind, tot, drow[s], srow[s], foff, dw, mw, st[s]))
            return new

        group_blocks(b, b.sdiv(xq.cols, _i64(32)), RT, body, out, t, i, order, chains)
        return ctx.get_dummy_value()

    return codegen



def _q4_i16_vnni_group_codegen(kind, RT, chains=None):
    """Tile codegen for GROUP q4_0/q4_1 rows x RT tokens of int16 activations on AVX-512
    VNNI, B = 32: the row-group tile's per-block float work (scale_block, group_blocks:
    the same operations in the same order, so the same results bit for bit) on integer dot
    products made by vpdpwssd (i16 x i16 pairs summed into i32 lanes), which the generic
    IR of _group_codegen does not reach (it lowers to vpmovzxbw + vpmaddwd + a pair-sum
    shuffle per 16 products, and vphaddd trees).

    Per block: two rows' 16 nibble bytes side by side, zero-extended to 32 x i16 once
    (shared by the tokens); & 15 gives elements 0..15 of both rows, >> 4 elements 16..31,
    against the activation's halves broadcast to both 256-bit halves: two vpdpwssd per row
    pair and token, rows r and r + 1 in lanes 0-7 and 8-15. Three levels of pair sums
    (even | odd lanes of two vectors) leave row r's sum in lane r. Sums fit in i32: 32
    products of at most 31 x 32767 per row and block. The 8 rows' scales (and q4_1's
    minima) come from one vpgatherdd of each row's first block dword, not 8 loads and
    inserts each.

    q5_0 / q5_1 (ggml's [f16 d][f16 m (q5_1)][u32 fifth bits][16 nibble bytes]) are the
    same tile plus each code's fifth bit (_fifth_bits: two masked adds per row pair), with
    q5_1's d q + m as q4_1's and q5_0's d (q - 16) as a minimum of -16 d: the kquant
    decode's 8-row tile (codegen_kquant.make_q5_group_tile).
    """
    BB, qs, qh = _group_layout(kind)
    scale_kind = "q4_1" if qh is not None else kind  # q5: d q + m (q5_0's m = -16 d)
    R = GROUP
    order = tuple(range(R))
    v16i, v32w = _v(I32, 16), _v(I16, 32)
    even, odd = list(range(0, 32, 2)), list(range(1, 32, 2))

    def codegen(ctx, b, sig, args):
        w, xq, out, i, t, wrow, xrow, drow, srow = _tile_rows(ctx, b, sig, args, R, RT)
        low = _c(v32w, [15] * 32)
        four = _c(v32w, [4] * 32)
        zero = _c(v16i, [0] * 16)
        dpw = _llvm_fn(b, "llvm.x86.avx512.vpdpwssd.512", v16i, [v16i] * 3)

        def pairs(u, v):
            return b.add(_pick(b, u, even, v), _pick(b, u, odd, v))

        # the 8 rows' first block dwords (d | m << 16) by one vpgatherdd, row r at r strides
        v8i = _v(I32, 8)
        gdd = _llvm_fn(b, "llvm.x86.avx2.gather.d.d.256", v8i, [v8i, BYTES, v8i, v8i, I8])
        sidx = b.trunc(w.stride, I32)
        idx = ir.Constant(v8i, ir.Undefined)
        for r in range(R):
            idx = b.insert_element(idx, b.mul(sidx, _c(I32, r)), _c(I32, r))

        def scales(ps):
            words = b.call(gdd, [_c(v8i, [0] * 8), ps[0], idx, _c(v8i, [-1] * 8), _c(I8, 1)])
            dw = _h2f(b, b.trunc(words, _v(I16, R)))
            if kind == "q5_0":
                return dw, b.fmul(dw, _c(_v(F32, R), [-16.0] * R), flags=FAST)
            mw = (_h2f(b, b.trunc(b.lshr(words, _c(v8i, [16] * 8)), _v(I16, R)))
                  if affine(kind) or kind == "q5_1" else None)
            return dw, mw

        nxt = w.row(b.add(i, _i64(PF_GROUPS * R)))  # the rows PF_GROUPS groups ahead

        def body(bi, st):
            ps = [b.gep(row, [b.mul(bi, _i64(BB))], inbounds=True) for row in wrow]
            _prefetch_ahead(b, nxt, bi, R * BB)
            xoff, foff = b.mul(bi, _i64(64)), b.mul(bi, _i64(4))
            ws = []
            for r in range(0, R, 2):
                raw = _pick(b, _load(b, ps[r], qs, _v(I8, 16)), range(32),
                            _load(b, ps[r + 1], qs, _v(I8, 16)))
                z = b.zext(raw, v32w)
                lo, hi = b.and_(z, low), b.lshr(z, four)
                if qh is not None:
                    lo, hi = _fifth_bits(b, lo, hi, _load(b, ps[r], qh, I32),
                                         _load(b, ps[r + 1], qh, I32))
                ws.append((b.bitcast(lo, v16i), b.bitcast(hi, v16i)))
            dw, mw = scales(ps)
            new = []
            for s in range(RT):
                halves = []
                for h in (0, 32):
                    xv = _load(b, xrow[s], b.add(xoff, _i64(h)), _v(I16, 16))
                    halves.append(b.bitcast(_pick(b, xv, list(range(16)) * 2), v16i))
                acc = [b.call(dpw, [b.call(dpw, [zero, lo, halves[0]]), hi, halves[1]])
                       for lo, hi in ws]
                quad = pairs(pairs(acc[0], acc[1]), pairs(acc[2], acc[3]))  # 2 lanes a row
                tot = b.add(_pick(b, quad, range(0, 16, 2)), _pick(b, quad, range(1, 16, 2)))
                new.append(scale_block(b, scale_kind, tot, drow[s], srow[s], foff, dw, mw,
                                       st[s]))
            return new

        group_blocks(b, b.sdiv(xq.cols, _i64(32)), RT, body, out, t, i, order, chains)
        return ctx.get_dummy_value()

    return codegen


def _fifth_bits(b, lo, hi, qa, qb):
    """q5 codes of a row pair: lo (<32 x i16>: elements 0..15 of rows a, b) and hi
    (elements 16..31) plus 16 where the element's bit of qa / qb (the rows' u32 fifth bits,
    bit j element j) is set, as masked adds (the masks built in scalar registers)."""
    mlo = b.or_(b.and_(qa, _c(I32, 0xFFFF)), b.shl(qb, _c(I32, 16)))
    mhi = b.or_(b.lshr(qa, _c(I32, 16)), b.and_(qb, _c(I32, -65536)))
    sixteen = _c(_v(I16, 32), [16] * 32)
    return [b.select(b.bitcast(m, ir.VectorType(ir.IntType(1), 32)), b.add(v, sixteen), v)
            for v, m in ((lo, mlo), (hi, mhi))]


def _last_block(b, kind, bi, wrow, xrow, drow, srow, st, RT, A=I8):
    """Add one 32-column block (index bi, B = 32) to the scalar results st."""
    hdr, BB = block_layout(kind)
    st = list(st)
    for r, row in enumerate(wrow):
        p = b.gep(row, [b.mul(bi, _i64(BB))], inbounds=True)
        dw = _f16(b, p, 0)
        wv = weights(b, kind, p) if signed(kind) else _nibbles(b, p, hdr, 32)
        dot = weight_dot(b, kind, wv)
        for s in range(RT):
            x = _load(b, xrow[s], b.mul(bi, _i64(A.width * 4)), _v(A, 32))
            dx = _load(b, drow[s], b.mul(bi, _i64(4)), F32)
            v = b.fmul(_hsum(b, b.sitofp(dot(x), _v(F32, 8))), b.fmul(dw, dx, flags=FAST),
                       flags=FAST)
            if not signed(kind):
                ds = _load(b, srow[s], b.mul(bi, _i64(4)), F32)
                fm = (_f16(b, p, 2) if affine(kind)
                      else b.fmul(dw, _c(F32, -float(zero(kind))), flags=FAST))
                v = b.fadd(v, b.fmul(fm, ds, flags=FAST), flags=FAST)
            st[r * RT + s] = b.fadd(st[r * RT + s], v, flags=FAST)
    return st



def _stacked(kind, B, RT, A=I8):
    """A GROUP x RT tile as GROUP / 2 tiles of 2 x RT (block sizes 64 and 128)."""
    pair = _q8act_codegen(kind, B, 2, RT, A)

    def codegen(ctx, b, sig, args):
        for r in range(0, GROUP, 2):
            pair(ctx, b, sig, [*args[:1], b.add(args[1], _i64(r)), *args[2:]])
        return ctx.get_dummy_value()

    return codegen


def make_tile(kind, RW, RT, chains=None):
    """The intrinsic tile_<kind>_<RW>x<RT>(W, block, i, xq, xd, xds, t, out) (tiles.py).

    xq int8 or int16 [T, K] (the same block scales xd, xds): the codegen follows its type.
    chains: of a row-group tile with B = 32 (see _group_codegen; on AVX2 with int16
    activations the q4 row groups are _q4_i16_row_codegen's, in the 8x1 tile's one chain).
    """
    name = f"tile_{kind}_{RW}x{RT}" + (f"c{chains}" if chains else "")

    def make(B, A):
        # decode's one-row tile: 256-bit blocks measured faster for q8_0 and q4_0, 64-column
        # units for q4_1; q8_0: 4 rows (the activation side shared between them, the next
        # rows prefetched), faster hot and from memory
        if B == 32 and A == I16 and not VNNI and not signed(kind) and (RT == 1 or chains):
            # AVX2 / portable: fewer shuffles than the row group (faster for q4_0 and q4_1
            # from L2); the batched
            # step's 8xRT tiles (chains) give each token the 8x1 tile's sums bit for bit
            if RT == 1:
                return _rows_of(_q4_i16_row_codegen(kind, min(RW, 4)), RW, min(RW, 4))
            sub = max(1, 4 // RT)
            return _rows_of(_q4_i16_row_codegen(kind, sub, RT, chains=1), RW, sub)
        if B == 32 and RT == 1 and (RW == 1 and not affine(kind) or RW == 4 and signed(kind)):
            return _q8act_row_codegen(kind, RW, A)
        if B == 32 and RW == 4 and signed(kind) and chains:  # the batched step's
            return _q8act_row_codegen(kind, RW, A, RT)
        if RW == GROUP and B == 32 and A == I16 and VNNI and not signed(kind):
            return _q4_i16_vnni_group_codegen(kind, RT, chains)
        if RW == GROUP:
            return _group_codegen(kind, RT, A, chains) if B == 32 else _stacked(kind, B, RT, A)
        return _q8act_codegen(kind, B, RW, RT, A)

    by_act = {types.int8: by_block_of(kind, lambda B: make(B, I8)),
              types.int16: by_block_of(kind, lambda B: make(B, I16))}

    def codegen(ctx, b, sig, args):
        return by_act[sig.args[3].dtype](ctx, b, sig, args)

    arrays = {0: types.uint8, 3: (types.int8, types.int16), 4: types.float32, 5: types.float32,
              7: types.float32}
    return _typed(name, codegen, arrays, ints=(1, 2, 6))
