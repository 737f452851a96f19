"""Prefill's panels on Intel AMX tiles (Sapphire Rapids and later): int16 activations.

AMX multiplies int8 tiles: C[m, n] += sum_k A[m, k] B[k, n] with A up to 16 rows x 64 bytes
and B in the "VNNI" layout, row k // 4 holding bytes k % 4 of every column side by side.
A panel block (panel.py) is that layout already: chunk c holds codes 4c..4c+3 of the 8
weight rows (q4's 0..15; q8_0's w + 128, taken back to w here). The default path's
activations are int16 (act_quant.py): a token's block of 32 is 64 bytes, low and high bytes
alternating, and loads as one A row as it is stored. The blocks of two panels (16 weight
rows) are expanded once per call into two B tiles against those 64 bytes (`_expand`):

  B_lo row r, column n = (w[n, 2r], 0, w[n, 2r + 1], 0)   against the low bytes (unsigned)
  B_hi row r, column n = (0, w[n, 2r], 0, w[n, 2r + 1])   against the high bytes (signed)

so tdp(A, B_lo) + 256 tdp(A, B_hi) (tdpbuud / tdpbsud for q4's unsigned codes, tdpbusd /
tdpbssd for q8_0's signed ones) is sum_k x[k] w[k] for the block: each byte product meets a
zero in the other tile, and the int32 is the one the vpdpwssd panel tile sums. The block's
float work is panel.py's scale_block on 16 lanes (`_scale`: the same operations, one
accumulator chain a token), so the results differ from the panel tiles' only where LLVM
contracts the multiply-adds differently (within 1e-6 of the largest output, tests/
test_amx.py). A pass runs 32 tokens (two A tiles against the same B tiles, four C tiles:
all eight tile registers) over every block, the C tiles stored to a stack scratch and read
back as one <16 x i32> a token, one block multiplied while the one before is scaled; the
last pass ends at T and overlaps the one before when T % 32 != 0.

  amx_tokens_<kind>(panel, scales, xq, xd, xs, xds, out, bx, i, T)
      out[:T, i:i+16] from panel and scales rows 0 and 1 (rows i..i+7, i+8..i+15, packed
      by pack_<kind>); bx uint8 [1, >= nb * BX_BLOCK] scratch; xq int16 [>= T, K], T >= 32;
      xs unused (the panel tiles' signature)
Faster than the panel tiles from 32 tokens (the figures: docs/design-figures.md).
The operating system must let the process use AMX's tile state first (Linux:
arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA), simd.amx_permitted()); simd.AMX says whether
it is used. Callers validate shapes (matmul.py): these do not check bounds.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..codegen import ir as irh
from ..codegen.int8_tiles import GROUP
from ..codegen.ir import F32, FAST, I8, I16, I32, _c, _i64, _load, _pick, _splat, _v
from ..codegen.packing import affine, signed, zero
from ..runtime.simd import AMX
from .panel import PANEL_BLOCK, SCALES_BLOCK

__all__ = ["BX_BLOCK", "MIN_TOKENS", "ROWS", "TOKENS", "amx_panels", "make_tokens"]

ROWS = 2 * GROUP  # weight rows a tile: two panels (C: 16 columns of i32)
TOKENS = 16  # tokens a tile (A and C rows); a pass runs two tiles against the same B
BX_BLOCK = 2 * 16 * 64  # expanded bytes a block: B_lo, B_hi (16 rows x 64 bytes each)
MIN_TOKENS = 2 * TOKENS  # fewer tokens stay on the vpdpwssd tiles
CS_BYTES = 4 * TOKENS * 64  # one block's four C tiles, stored
C0_LO, C0_HI, C1_LO, C1_HI, A0, A1, B_LO, B_HI = range(8)  # tile registers
VOID = ir.VoidType()
BYTES = I8.as_pointer()
V16 = _v(F32, 16)
V16I = _v(I32, 16)


def _tile(b, name, *args):
    """Call llvm.x86.<name> with i8 tile numbers (ints) and other IR values."""
    vals = [_c(I8, a) if isinstance(a, int) else a for a in args]
    fn = irh._llvm_fn(b, f"llvm.x86.{name}", VOID, [v.type for v in vals])
    b.call(fn, vals)


def _aligned(b, ty):
    """A stack slot of type ty in the entry block, 64-byte aligned."""
    p = cgutils.alloca_once(b, ty)
    p.align = 64
    return p


def _configure(b):
    """Load the tile configuration: palette 1, all eight tiles 16 rows of 64 bytes."""
    cfg = _aligned(b, _v(I8, 64))
    init = [0] * 64
    init[0] = 1
    for t in range(8):
        init[16 + 2 * t] = 64
        init[48 + t] = 16
    b.store(_c(_v(I8, 64), init), cfg)
    _tile(b, "ldtilecfg", b.bitcast(cfg, BYTES))


def _expand(b, panel, bx, nblocks, signed):
    """Panel rows 0 and 1 (two groups of 8 weight rows, nblocks blocks of PANEL_BLOCK bytes)
    -> B_lo, B_hi tiles in bx (module docstring): B row r is group 0's 8 columns, then
    group 1's."""
    prows = [panel.row(_i64(g)) for g in (0, 1)]

    def body(bi, st):
        src = b.mul(bi, _i64(PANEL_BLOCK))
        dst = b.mul(bi, _i64(BX_BLOCK))
        for c in range(8):
            for g, prow in enumerate(prows):
                chunk = _load(b, prow, b.add(src, _i64(32 * c)), _v(I8, 32))
                if signed:  # q8_0's panels hold w + 128: w again, sign-extended
                    chunk = b.xor(chunk, _c(_v(I8, 32), [-128] * 32))
                    wide = b.and_(b.sext(chunk, _v(I16, 32)), _c(_v(I16, 32), [255] * 32))
                else:
                    wide = b.zext(chunk, _v(I16, 32))  # row n's 4 codes in i16 lanes 4n..4n+3
                lanes = b.bitcast(wide, V16I)  # lane 2n: codes 0, 1; lane 2n + 1: codes 2, 3
                for h in range(2):  # B rows 2c (codes 0, 1 of each row), 2c + 1 (2, 3)
                    lo = _pick(b, lanes, range(h, 16, 2))
                    hi = b.shl(b.bitcast(lo, _v(I16, 16)), _c(_v(I16, 16), [8] * 16))
                    off = b.add(dst, _i64(64 * (2 * c + h) + 32 * g))
                    irh._store_vec(b, bx, off, lo)
                    irh._store_vec(b, bx, b.add(off, _i64(BX_BLOCK // 2)), hi)
        return st

    irh._for(b, _i64(0), nblocks, [], body)


def _scale(b, kind, tot, dx, ds, dw, mw, acc):
    """panel.py's scale_block on 16 lanes: acc + tot dx dw (q4_0: (tot dx - 8 ds) dw;
    q4_1: + mw ds), the same operations in the same order."""
    f = b.fmul(b.sitofp(tot, V16), _splat(b, dx, 16), flags=FAST)
    if zero(kind):
        f = b.fadd(f, _splat(b, b.fmul(ds, _c(F32, -float(zero(kind))), flags=FAST), 16),
                   flags=FAST)
    acc = b.fadd(acc, b.fmul(f, dw, flags=FAST), flags=FAST)
    if affine(kind):
        acc = b.fadd(acc, b.fmul(mw, _splat(b, ds, 16), flags=FAST), flags=FAST)
    return acc


def _tokens_codegen(kind):
    def codegen(ctx, b, sig, args):
        panel, scales, xq, xd, xs, xds, out, bx = (
            irh._Rows(ctx, b, sig.args[k], args[k]) for k in range(8))
        i, T = args[8], args[9]
        srows = [scales.row(_i64(g)) for g in (0, 1)]
        brow = bx.row(_i64(0))
        nblocks = b.sdiv(xq.cols, _i64(32))
        _expand(b, panel, brow, nblocks, signed(kind))
        cs = b.bitcast(_aligned(b, _v(I8, 2 * CS_BYTES)), BYTES)  # two blocks' C tiles
        acc = b.bitcast(_aligned(b, _v(F32, 2 * TOKENS * ROWS)), V16.as_pointer())
        zero = _c(V16, [0.0] * 16)
        _configure(b)

        def pass_(p, st):  # tokens t0..t0+31; the last pass ends at T (T >= 32)
            t0 = b.mul(p, _i64(2 * TOKENS))
            t0 = b.select(b.icmp_signed(">", t0, b.sub(T, _i64(2 * TOKENS))),
                          b.sub(T, _i64(2 * TOKENS)), t0)

            rows = [b.add(t0, _i64(s)) for s in range(2 * TOKENS)]
            x0, x1 = xq.row(t0), xq.row(rows[TOKENS])
            for s in range(2 * TOKENS):
                b.store(zero, b.gep(acc, [_i64(s)]))

            def multiply(bi):  # block bi's four C tiles into cs half bi % 2
                bp = b.gep(brow, [b.mul(bi, _i64(BX_BLOCK))], inbounds=True)
                _tile(b, "tileloadd64", B_LO, bp, _i64(64))
                _tile(b, "tileloadd64", B_HI, b.gep(bp, [_i64(BX_BLOCK // 2)]), _i64(64))
                xo = b.mul(bi, _i64(64))
                c = b.gep(cs, [b.mul(b.and_(bi, _i64(1)), _i64(CS_BYTES))])
                for a, x, lo, hi, k in ((A0, x0, C0_LO, C0_HI, 0), (A1, x1, C1_LO, C1_HI, 2)):
                    _tile(b, "tileloadd64", a, b.gep(x, [xo], inbounds=True), xq.stride)
                    _tile(b, "tilezero", lo)
                    _tile(b, "tilezero", hi)
                    _tile(b, "tdpbusd" if signed(kind) else "tdpbuud", lo, a, B_LO)
                    _tile(b, "tdpbssd" if signed(kind) else "tdpbsud", hi, a, B_HI)
                    for tile, q in ((lo, k), (hi, k + 1)):
                        _tile(b, "tilestored64", tile,
                              b.gep(c, [_i64(q * TOKENS * 64)]), _i64(64))

            def scale(bi):  # block bi's sums from cs into the accumulators
                c = b.gep(cs, [b.mul(b.and_(bi, _i64(1)), _i64(CS_BYTES))])
                sb = b.mul(bi, _i64(4 * SCALES_BLOCK))

                def both(off):  # the two panels' 8 floats at byte off of their scales
                    halves = [_load(b, r, off, _v(F32, 8)) for r in srows]
                    return _pick(b, halves[0], range(16), halves[1])

                dw = both(sb)
                mw = both(b.add(sb, _i64(4 * GROUP))) if affine(kind) else None
                foff = b.mul(bi, _i64(4))
                for s in range(2 * TOKENS):
                    tile, row = divmod(s, TOKENS)
                    lo = _load(b, c, (2 * tile * TOKENS + row) * 64, V16I)
                    hi = _load(b, c, ((2 * tile + 1) * TOKENS + row) * 64, V16I)
                    tot = b.add(lo, b.shl(hi, _c(V16I, [8] * 16)))
                    r = rows[s]
                    ds = _load(b, xds.row(r), foff, F32) if not signed(kind) else None
                    a = b.gep(acc, [_i64(s)])
                    b.store(_scale(b, kind, tot, _load(b, xd.row(r), foff, F32), ds, dw, mw,
                                   b.load(a)), a)

            def block(bi, st):  # multiply block bi while the sums of bi - 1 are scaled
                with b.if_then(b.icmp_signed(">", bi, _i64(0))):
                    scale(b.sub(bi, _i64(1)))
                with b.if_then(b.icmp_signed("<", bi, nblocks)):
                    multiply(bi)
                return st

            irh._for(b, _i64(0), b.add(nblocks, _i64(1)), [], block)
            for s, r in enumerate(rows):
                irh._store_vec(b, out.row(r), b.mul(i, _i64(4)), b.load(b.gep(acc, [_i64(s)])))
            return st

        irh._for(b, _i64(0), b.sdiv(b.add(T, _i64(2 * TOKENS - 1)), _i64(2 * TOKENS)), [], pass_)
        _tile(b, "tilerelease")
        return ctx.get_dummy_value()

    return codegen


@intrinsic
def amx_panels(typingctx, xq):
    """Whether panels meet activations xq on AMX tiles (int16 activations where simd.AMX),
    as a compile-time constant."""
    on = AMX and isinstance(xq, types.Array) and xq.dtype == types.int16

    def codegen(ctx, b, sig, args):
        return ir.Constant(ir.IntType(1), int(on))

    return types.boolean(xq), codegen


def make_tokens(kind):
    """amx_tokens_<kind>(panel, scales, xq, xd, xs, xds, out, bx, i, T). It also types for
    int8 xq, where it emits nothing: the int8 kernels share their source with the int16 ones
    and never call it (amx_panels is False for them)."""
    arrays = {0: types.uint8, 1: types.float32, 2: (types.int8, types.int16),
              3: types.float32, 4: types.int32, 5: types.float32, 6: types.float32,
              7: types.uint8}
    int16 = _tokens_codegen(kind)

    def codegen(ctx, b, sig, args):
        if sig.args[2].dtype == types.int16:
            return int16(ctx, b, sig, args)
        return ctx.get_dummy_value()

    return irh._typed(f"amx_tokens_{kind}", codegen, arrays, ints=(8, 9))
