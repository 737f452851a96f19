"""Prefill of q4_k, q5_k and q6_k matrices on int16 activations with AVX-512 VNNI (the
default path): 16 weight rows unpacked once a call into an int16 panel, then met by the
tokens eight at a time, one vpdpwssd a row pair of values and token with the token's pair
broadcast from memory.

kquant_int.py's other panels (panel.py: 8 rows as q4_1 bytes, or q6_k's 8-row wide panels)
spend ~31 instructions a token per 8 rows x 32 values for its 8 vpdpwssd: each chunk's 4
activations broadcast to a register, the codes widened per use, the two lanes of a row
added and the float work on half vectors. Here lanes are rows, so the panel holds what the
instruction multiplies, and nothing is left to do per token but the dot products and the
float work on whole vectors:

  panel uint8 [., nb * BLOCK16]   per block of 32 columns, 16 chunks of 64 bytes: chunk c
                                  lane r (an i32) holds row r's values 2c, 2c + 1 as int16:
                                  q4_k / q5_k their codes q (0..31), q6_k sc (q - 32)
                                  (|.| <= 4096, panel.py's wide values)
  scales float32 [., nb * 32]     per block, the 16 rows' dw, then (q4_k / q5_k) their mw:
                                  q4_1's d sc and -dmin m (panel.py's pack_q4_k), or q6_k's d

A token's block is 16 vpdpwssd and ~14 other instructions (the float work, loads) where the
8-row panels take ~62 for the same 16 rows. The integer sums are exact and each block's
float work is the 8-row tiles' operations in their compiled order (q4_1's int16 tiles:
fma(mw, xds, acc), then fma(tot, dw dx, acc); q6_k's wide ones: fma(tot dw, dx, acc)),
written as explicit fused multiply-adds, with the blocks added in the same chains (one;
two, even and odd blocks, for the tokens the 8-row path gives its one-token tiles: see
_tokens16), so every output is the 8-row path's bit for bit (tests/test_panel16.py).

  pack16_<q4_k|q5_k|q6_k>(w, i, panel, scales, g)     rows i..i+15 -> panel row g
  ktile16_<q4_k|q6_k>_<variant>(panel, scales, g, xq, xd, xds, t | toks, out, i)
      out[u, i + r] = row i + r . token u, r < 16, for the tile's tokens u: "run" t..t+7,
      "flex4" toks[0, :4], "two4" toks[0, :4] in two float chains
  k16_rows(kind, w, xq, xd, xds, out, r0, r1, T)   the whole groups of 16 rows of
      r0..r1-1 through the panels where xq is int16 on VNNI (else none); returns the
      first row not done
Callers validate shapes (linear.py): these do not check bounds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import overload

from ..codegen.ir import (
    F32,
    I8,
    I16,
    I32,
    I64,
    FAST,
    _c,
    _f16,
    _for,
    _i64,
    _llvm_fn,
    _load,
    _loop,
    _pick,
    _Rows,
    _splat,
    _store_vec,
    _typed,
    _v,
    vpdpwssd_bcast,
)
from ..codegen.kquant_tiles import SUPER_BYTES, _codes, _scales_k4
from ..modelfile import quant
from ..runtime.simd import VNNI
from .jit import GLUE, kernel

# inlined into the caller by numba: a call passing ten arrays costs a tenth of a tile
INLINE = dict(GLUE, inline="always")

__all__ = ["BLOCK16", "ROWS16", "SCALES16", "k16_rows"]

ROWS16 = 16  # weight rows of a panel: a lane each
BLOCK16 = ROWS16 * 32 * 2  # panel bytes a block of 32 columns: int16 values
SCALES16 = 2 * ROWS16  # scales floats a block: dw, then mw
SLOTS = 8  # tokens a tile (16 int accumulators, 8 float ones; 4 and 6 measured slower)
INT_CHAINS = 2  # vpdpwssd chains a token and block (integer sums: any split is exact)
Q4_K, Q5_K, Q6_K = (quant.TYPES[n].code for n in ("q4_k", "q5_k", "q6_k"))


def _transpose(b, vecs):
    """16 <16 x T> vectors -> 16: output c lane r = input r lane c. Four rounds of two-input
    shuffles (a butterfly on the lane and vector indices' bits: in round `bit` the vectors
    differing in that bit trade their lanes with it set / clear)."""
    n = len(vecs)
    # labels: vecs[v][lane] = (row, col); at the end vector c holds (r, c) at lane r
    lab = [[(v, c) for c in range(n)] for v in range(n)]
    vecs = list(vecs)
    for bit in (8, 4, 2, 1):
        for v in range(n):
            if v & bit:
                continue
            u = v | bit
            pool = lab[v] + lab[u]
            new = {}
            for dst, want in ((v, 0), (u, bit)):
                # keep the elements whose column has `bit` == want; their lane's `bit` becomes
                # their row's
                idx, lanes = [0] * n, [None] * n
                for k, (r, c) in enumerate(pool):
                    if c & bit == want:
                        lane = (k % n) & ~bit | r & bit
                        idx[lane], lanes[lane] = k, (r, c)
                new[dst] = (_pick(b, vecs[v], idx, vecs[u]), lanes)
            for dst, (vec, lanes) in new.items():
                vecs[dst], lab[dst] = vec, lanes
    assert all(lab[c][r] == (r, c) for c in range(n) for r in range(n)), "transpose"
    return vecs


def _pack16_codegen(kind):
    """pack16_<kind> (module docstring): per super-block, each row's 8 blocks of codes
    (kquant_tiles._codes: q4_k / q5_k's q, q6_k's q - 32 times its 16 values' int8 scale) as
    int16 pairs, the 16 rows transposed so that a row is a lane; q4_k / q5_k's dw, mw as
    panel.py's pack_q4_k computes them, q6_k's d."""
    SB = SUPER_BYTES[kind]
    six = kind == "q6_k"
    v16i, v32w, v16f = _v(I32, 16), _v(I16, 32), _v(F32, 16)

    def codegen(ctx, b, sig, args):
        w, panel, scales = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3))
        i, g = args[1], args[4]
        wrow = [w.row(b.add(i, _i64(r))) for r in range(ROWS16)]
        prow, srow = panel.row(g), scales.row(g)

        def body(sbi, st):
            ps = [b.gep(row, [b.mul(sbi, _i64(SB))], inbounds=True) for row in wrow]
            codes = [_codes(b, kind, p) for p in ps]  # [row][block] <32 x i8>
            if six:
                d = ir.Constant(v16f, ir.Undefined)
                for r, p in enumerate(ps):
                    d = b.insert_element(d, _f16(b, p, 208), _c(I32, r))
                scs = [b.sext(_load(b, p, 192, _v(I8, 16)), _v(I16, 16)) for p in ps]
            else:  # each row's [dw 0..7, mw 0..7], transposed: vector j (j < 8) is block
                # j's dw of the 16 rows, 8 + j its mw
                rows = []
                for p in ps:
                    sc8, m8 = _scales_k4(b, p)
                    dw = b.fmul(sc8, _splat(b, _f16(b, p, 0), 8), flags=("fast",))
                    mw = b.fmul(m8, _splat(b, b.fneg(_f16(b, p, 2)), 8), flags=("fast",))
                    rows.append(_pick(b, dw, range(16), mw))
                dwm = _transpose(b, rows)
            for j in range(8):
                if six:
                    vals = [b.mul(b.sext(c[j], v32w), _pick(b, sc, [2 * j] * 16 + [2 * j + 1] * 16))
                            for c, sc in zip(codes, scs, strict=True)]
                else:
                    vals = [b.zext(c[j], v32w) for c in codes]
                chunks = _transpose(b, [b.bitcast(v, v16i) for v in vals])
                blk = b.add(b.mul(sbi, _i64(8)), _i64(j))
                pb = b.mul(blk, _i64(BLOCK16))
                for c, ch in enumerate(chunks):
                    _store_vec(b, prow, b.add(pb, _i64(64 * c)), ch)
                so = b.mul(blk, _i64(4 * SCALES16))
                _store_vec(b, srow, so, d if six else dwm[j])
                if not six:
                    _store_vec(b, srow, b.add(so, _i64(64)), dwm[8 + j])
            return st

        _for(b, _i64(0), b.sdiv(w.cols, _i64(SB)), [], body)
        return ctx.get_dummy_value()

    return codegen


def _ktile16_codegen(kind, S, two, run):
    """ktile16_<kind>_<variant> (module docstring): S slots (tokens), whose blocks are added
    in one float chain each, or (two) in two: even and odd blocks, added at the end
    (int8_tiles.group_blocks' order for one token; its tail block, were the count odd,
    goes to the even chain). kind: "q4_k" (value dw q + mw, also q5_k's) or "q6_k" (dw q).
    run: the slots' tokens are t..t+S-1 (argument 6 an integer t), so the rows' addresses
    follow from one; else they are toks[0, :S] (argument 6 int64 [1, S]), whose S x 3
    row addresses LLVM recomputes each block (more than the registers hold)."""
    affine = kind != "q6_k"
    v16i, v16f = _v(I32, 16), _v(F32, 16)

    def codegen(ctx, b, sig, args):
        panel, scales, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k])
                                           for k in (0, 1, 3, 4, 5, 7))
        g, i = args[2], args[8]
        prow, srow = panel.row(g), scales.row(g)
        if run:
            tok = [b.add(args[6], _i64(s)) for s in range(S)]
        else:
            trow = _Rows(ctx, b, sig.args[6], args[6]).row(_i64(0))
            tok = [_load(b, trow, 8 * s, I64) for s in range(S)]
        xrows = [xq.row(u) for u in tok]
        drows = [xd.row(u) for u in tok]
        srows = [xds.row(u) for u in tok]
        zero = _c(v16i, [0] * 16)
        fma = _llvm_fn(b, "llvm.fma.v16f32", v16f, [v16f] * 3)

        def block(bi, accs):
            """accs (a <16 x f32> a slot) + block bi of every slot's token."""
            pb = b.mul(bi, _i64(BLOCK16))
            xoff, foff = b.mul(bi, _i64(64)), b.mul(bi, _i64(4))
            at = [b.ptrtoint(b.gep(x, [xoff], inbounds=True), I64) for x in xrows]
            dots = [[zero] * INT_CHAINS for _ in range(S)]
            for c in range(16):
                wv = _load(b, prow, b.add(pb, _i64(64 * c)), v16i)
                for s in range(S):
                    k = c % INT_CHAINS
                    dots[s][k] = vpdpwssd_bcast(b, dots[s][k], wv, at[s], 4 * c)
            so = b.mul(bi, _i64(4 * SCALES16))
            dw = _load(b, srow, so, v16f)
            mw = _load(b, srow, b.add(so, _i64(64)), v16f) if affine else None
            new = []
            for s in range(S):
                tot = dots[s][0]
                for d in dots[s][1:]:
                    tot = b.add(tot, d)
                ft = b.sitofp(tot, v16f)
                dx = _splat(b, _load(b, drows[s], foff, F32), 16)
                if affine:  # q4_1's int16 panel tiles: fma(mw, xds, acc), fma(tot, dw dx, acc)
                    ds = _splat(b, _load(b, srows[s], foff, F32), 16)
                    a = b.call(fma, [mw, ds, accs[s]])
                    new.append(b.call(fma, [ft, b.fmul(dw, dx), a]))
                else:  # q6_k's wide panel tiles: fma(tot dw, dx, acc)
                    new.append(b.call(fma, [b.fmul(ft, dw), dx, accs[s]]))
            return new

        nb = b.sdiv(xq.cols, _i64(32))
        zf = _c(v16f, [0.0] * 16)
        st = _loop(b, nb, [zf] * S, block, unroll=2 if two else 1)
        acc = st[0]
        for other in st[1:]:
            acc = [b.fadd(u, v, flags=FAST) for u, v in zip(acc, other, strict=True)]
        for s in range(S):
            _store_vec(b, out.row(tok[s]), b.mul(i, _i64(4)), acc[s])
        return ctx.get_dummy_value()

    return codegen


def _make_pack16(kind):
    return _typed(f"pack16_{kind}", _pack16_codegen(kind),
                  {0: types.uint8, 2: types.uint8, 3: types.float32}, ints=(1, 4))


def _make_ktile16(kind, variant):
    """ktile16_<kind>_<variant>: "run" (SLOTS tokens t..t+SLOTS-1), "flex4" (4 tokens toks),
    "two4" (4 tokens toks, two float chains each)."""
    S = 4 if variant.endswith("4") else SLOTS
    run = variant == "run"
    arrays = {0: types.uint8, 1: types.float32, 3: types.int16, 4: types.float32,
              5: types.float32, 7: types.float32}
    if not run:
        arrays[6] = types.int64
    return _typed(f"ktile16_{kind}_{variant}",
                  _ktile16_codegen(kind, S, variant == "two4", run), arrays,
                  ints=(2, 6, 8) if run else (2, 8))


pack16_q4_k = _make_pack16("q4_k")
pack16_q5_k = _make_pack16("q5_k")
pack16_q6_k = _make_pack16("q6_k")
ktile16_q4_k_run, ktile16_q4_k_flex4, ktile16_q4_k_two4 = (
    _make_ktile16("q4_k", v) for v in ("run", "flex4", "two4"))
ktile16_q6_k_run, ktile16_q6_k_flex4, ktile16_q6_k_two4 = (
    _make_ktile16("q6_k", v) for v in ("run", "flex4", "two4"))


@kernel
def _pack16(kind, w, i, panel, scales):
    if kind == Q4_K:
        pack16_q4_k(w, i, panel, scales, 0)
    elif kind == Q5_K:
        pack16_q5_k(w, i, panel, scales, 0)
    else:
        pack16_q6_k(w, i, panel, scales, 0)


@njit(**INLINE)
def _run16(kind, panel, scales, xq, xd, xds, t, out, i):
    """Tokens t..t+SLOTS-1 on `kind`'s panels, one float chain each."""
    if kind == Q6_K:
        ktile16_q6_k_run(panel, scales, 0, xq, xd, xds, t, out, i)
    else:
        ktile16_q4_k_run(panel, scales, 0, xq, xd, xds, t, out, i)


@njit(**INLINE)
def _flex16(kind, two, first, last, panel, scales, xq, xd, xds, toks, out, i):
    """Tokens first..last-1 (at most 4) in a tile of 4, the last token repeated to fill it
    (computed the same way each time); two: two float chains."""
    for s in range(4):
        toks[0, s] = min(first + s, last - 1)
    if kind == Q6_K:
        if two:
            ktile16_q6_k_two4(panel, scales, 0, xq, xd, xds, toks, out, i)
        else:
            ktile16_q6_k_flex4(panel, scales, 0, xq, xd, xds, toks, out, i)
    elif two:
        ktile16_q4_k_two4(panel, scales, 0, xq, xd, xds, toks, out, i)
    else:
        ktile16_q4_k_flex4(panel, scales, 0, xq, xd, xds, toks, out, i)


@kernel
def _tokens16(kind, panel, scales, xq, xd, xds, out, i, T, toks):
    """out[:T, i:i+16] from the panel. The tokens the 8-row path gives its one-token tiles
    (q4_k / q5_k's last T % 6 % 4, q6_k's last T % 4), whose blocks it adds in two float
    chains, are added so here too (one "two4" tile); the others SLOTS at a time, the last
    tile reaching back over tokens done (recomputed the same) when they do not divide."""
    n1 = T - (T % 4 if kind == Q6_K else T % 6 % 4)  # tokens of one chain
    for t in range(0, n1 - SLOTS + 1, SLOTS):
        _run16(kind, panel, scales, xq, xd, xds, t, out, i)
    if n1 % SLOTS and n1 > SLOTS:
        _run16(kind, panel, scales, xq, xd, xds, n1 - SLOTS, out, i)
    elif n1 % SLOTS:  # fewer than SLOTS tokens: four at a time
        for t in range(0, n1, 4):
            _flex16(kind, False, t, n1, panel, scales, xq, xd, xds, toks, out, i)
    if n1 < T:
        _flex16(kind, True, n1, T, panel, scales, xq, xd, xds, toks, out, i)


def k16_rows(kind, w, xq, xd, xds, out, r0, r1, T):
    """out[:T, r0:g] for the whole groups of 16 rows of r0..r1-1 (g: the first row not
    done, returned) where the activations xq run on these panels (int16 on AVX-512 VNNI:
    decided while numba types the caller); elsewhere nothing (returns r0)."""
    raise NotImplementedError("k16_rows runs in kernels only")


def _k16_impl(kind, w, xq, xd, xds, out, r0, r1, T):
    g = r0 + (r1 - r0) // ROWS16 * ROWS16
    if g == r0:
        return r0
    K = xq.shape[1]
    panel = np.empty((1, K // 32 * BLOCK16), np.uint8)
    scales = np.empty((1, K // 32 * SCALES16), np.float32)
    toks = np.empty((1, 4), np.int64)
    for i in range(r0, g, ROWS16):
        _pack16(kind, w, i, panel, scales)
        _tokens16(kind, panel, scales, xq, xd, xds, out, i, T, toks)
    return g


@overload(k16_rows, jit_options=GLUE)
def _k16_rows(kind, w, xq, xd, xds, out, r0, r1, T):
    if VNNI and isinstance(xq, types.Array) and xq.dtype == types.int16:
        return _k16_impl
    return lambda kind, w, xq, xd, xds, out, r0, r1, T: r0
