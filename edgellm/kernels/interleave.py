"""The batched decode step's weights, interleaved 16 rows a group so that a token's block
dot products need no horizontal sums: issue 24's 4-row step on the fast path.

The row-group tile of codegen_int8.py (decode's 8x1, the batched step's 8x4c2) dots each
weight row with the token in its own lanes and then reduces the lanes to a sum per row:
per block and token, the pair-sum shuffles cost more than the dot products (q8_0's 4-row
tile keeps 16 float partial sums a row instead: four float operations a block, row and
token). Prefill avoids both with panels packed per call (panel.py), which four tokens do
not pay back. Here the batched step keeps a copy of its q4_0, q4_1 and q8_0 matrices in a
layout whose lanes are rows already (`interleave`, made once when the server's step is
built; the same bytes as the file's blocks, rearranged):

  wi uint8 [rows / 16, nb * BB]   group g = rows 16g..16g+15; per block of 32 columns BB
                                  bytes: the 16 rows' f16 d, (q4_1) their 16 f16 m, then
                                  q4: 4 chunks of 32 u16 words: word 2l + p of chunk c
                                  holds row l's codes at columns 8c + 2s + p, s = 0..3, in
                                  its nibbles s (bits 4s..4s+3);
                                  q8_0: 16 chunks of 32 bytes: bytes 2l, 2l + 1 of chunk j
                                  are row l's codes at columns 2j, 2j + 1

So (q4 chunk c >> 4s) & 15, or q8_0's chunk j sign-extended, is as <16 x i32> of i16 pairs
lane l = row l's codes at columns 2j, 2j + 1 (q4: j = 4c + s), and one vpdpwssd with the
token's activation pair (2j, 2j + 1) broadcast adds them into lane l: 16 of those make each
lane its row's block dot product. For q4 that is the integer the 8x1 tile reduces to, and
the float work per block is the 8x1 tile's as it is compiled (_scale), on 16 lanes, with
the blocks in group_blocks' two chains: lane by lane the 8x1 tile's operations in its
order, so each row's result is the single step's bit for bit (tests/test_interleave.py).
q8_0's block sum is one integer here where the 4x1 tile keeps 16 partial sums in floats:
the same products, rounded in another order (a row's result differs from the single step's
by rounding), with no horizontal sums.

For int8 activations (act_type "int8", llama.cpp's) the codes are laid out for vpdpbusd,
which multiplies four u8 by four i8 a lane (`interleave(w, kind, np.int8)`, same sizes):

  q4:    4 chunks of 64 bytes: byte 4l + k of chunk c holds row l's codes at columns
         8c + k (low nibble) and 8c + 4 + k (high nibble), k = 0..3
  q8_0:  8 chunks of 64 bytes: bytes 4l..4l + 3 of chunk j are row l's codes at columns
         4j..4j + 3, plus 128 (unsigned); the tile takes 128 x the token's block sum xs off

so a chunk's lanes (masked to a nibble, or as they are) meet the token's four activations
broadcast from memory: 8 vpdpbusd a block and token where int16 takes 16 vpdpwssd, the same
integer sums in half the instructions.

  itile_<q4_0|q4_1|q8_0>_16x<RT>(wi, g, xq, xd, xs, xds, t, out, i)
      out[t + s, i + r] = row 16g + r of W . token t + s, r < 16, s < RT
xq int16 (the default path's: vpdpwssd) or int8 (vpdpbusd; xs is read only there) on
AVX-512 VNNI; elsewhere the generic multiply-add IR (vpmaddwd on x86). Callers validate
shapes (step/batched.py builds wi from a matrix the fused step checked): no bounds checks.
"""

from __future__ import annotations

import numpy as np
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
from ..codegen.packing import BLOCK_BYTES
from ..modelfile import quant
from ..runtime.simd import VNNI

__all__ = ["ILV_BLOCK", "ILV_ROWS", "interleave", "make_itile"]

ILV_ROWS = 16  # weight rows of a group: one <16 x i32> lane each
PF = 2048  # bytes a tile prefetches ahead of its block (measured best from memory
# against 1024 and 4096)
# the layouts this module writes, and bytes of a group's block: the 16 rows' scales (and
# minima), then their codes: the 16 rows' blocks of 32, rearranged
ILV_BLOCK = {n: ILV_ROWS * quant.TYPES[n].block_bytes(32) for n in ("q4_0", "q4_1", "q8_0")}


def interleave(w: np.ndarray, kind: str, act=np.int16) -> np.ndarray:
    """ggml q4_0 / q4_1 / q8_0 rows (uint8 [rows, nb * 18 | 20 | 34], rows a multiple of
    16) -> the interleaved groups (uint8 [rows / 16, nb * ILV_BLOCK[kind]], module
    docstring) for activations of dtype act: int8 ones take q4's byte layout."""
    qs, BB = BLOCK_BYTES[kind]  # ggml's block: the header, then the codes
    rows, nb = w.shape[0], w.shape[1] // BB
    if rows % ILV_ROWS or w.shape[1] != nb * BB:
        raise ValueError(f"interleave: {kind} rows {w.shape} are not groups of 16 blocks")
    G = rows // ILV_ROWS
    blk = w.reshape(G, ILV_ROWS, nb, BB)
    d = blk[..., 0:2].transpose(0, 2, 1, 3).reshape(G, nb, 32)  # the 16 rows' f16 d
    int8 = np.dtype(act) == np.int8
    parts = [d]
    if kind == "q8_0":  # chunk j: rows 0..15's codes at columns 2j, 2j + 1 (int8: 4j..4j + 3,
        per = 4 if int8 else 2  # plus 128)
        q = blk[..., qs:].reshape(G, ILV_ROWS, nb, 32 // per, per).transpose(0, 2, 3, 1, 4)
        parts.append((q ^ 0x80 if int8 else q).reshape(G, nb, 512))
    else:
        if kind == "q4_1":
            parts.append(blk[..., 2:4].transpose(0, 2, 1, 3).reshape(G, nb, 32))  # and m
        parts.append(_q4_codes(blk[..., qs:qs + 16], int8))
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).reshape(G, -1))


def _q4_codes(q: np.ndarray, int8: bool) -> np.ndarray:
    """A q4 group's codes (uint8 [G, 16 rows, nb, 16], byte i: columns i (low nibble) and
    16 + i (high)) -> uint8 [G, nb, 256] in 4 chunks of 64 bytes (module docstring)."""
    G, _, nb, _ = q.shape
    if int8:  # byte 4l + k of chunk c: columns 8c + k, 8c + 4 + k
        cb = np.concatenate([q & 15, q >> 4], axis=-1).reshape(G, ILV_ROWS, nb, 4, 2, 4)
        quads = (cb[..., 0, :] | cb[..., 1, :] << 4).transpose(0, 2, 3, 1, 4)  # g, b, c, l, k
        return np.ascontiguousarray(quads).reshape(G, nb, 256)
    halves = []
    for codes in (q & 15, q >> 4):  # columns 0..15, then 16..31: chunks c = 0, 1, then 2, 3
        cw = codes.astype(np.uint16).reshape(G, ILV_ROWS, nb, 2, 4, 2)  # column 8c + 2s + p
        halves.append(cw[..., 0, :] | cw[..., 1, :] << 4 | cw[..., 2, :] << 8
                      | cw[..., 3, :] << 12)  # [G, l, nb, c, p]: nibble s
    words = np.concatenate(halves, axis=3).transpose(0, 2, 3, 1, 4)  # [G, nb, c, l, p]
    return np.ascontiguousarray(words).view(np.uint8).reshape(G, nb, 256)


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
    if kind == "q4_0":
        f = fma([ft, dx, b.fmul(ds, _c(vf, [-8.0] * L), flags=ORDERED)])
        return fma([f, dw, acc])
    if AB == 1:
        acc = fma([b.fmul(ft, dw, flags=ORDERED), dx, acc])
        return fma([mw, ds, acc])
    acc = fma([mw, ds, acc])
    return fma([ft, b.fmul(dx, dw, flags=ORDERED), acc])


def _itile_codegen(kind, RT):
    """Codegen of itile_<kind>_16x<RT> (module docstring)."""
    BB = ILV_BLOCK[kind]
    q0 = 64 if kind == "q4_1" else 32  # the chunks' offset in a block
    L = ILV_ROWS
    v16i, v32w = _v(I32, L), _v(I16, 2 * L)
    chains = 2 if RT > 1 else 4  # integer chains a token (any split: the same sums)

    def codegen(ctx, b, sig, args):
        w, xq, xd, xs, xds, out = (_Rows(ctx, b, sig.args[k], args[k])
                                   for k in (0, 2, 3, 4, 5, 7))
        g, t, i = args[1], args[6], args[8]
        AB = 2 if sig.args[2].dtype == types.int16 else 1
        wrow = w.row(g)
        toks = [b.add(t, _i64(s)) for s in range(RT)]
        xrows, drows, srows, irows = ([a.row(u) for u in toks] for a in (xq, xd, xds, xs))
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

        low = _c(v32w, [15] * (2 * L))

        def body(bi, st):
            p = b.gep(wrow, [b.mul(bi, _i64(BB))], inbounds=True)
            for c in range(0, BB, 64):  # the stream PF bytes ahead (a hint: may pass the end)
                _prefetch(b, b.gep(p, [_i64(PF + c)]))
            dw = _h2f(b, _load(b, p, 0, _v(I16, L)))
            mw = _h2f(b, _load(b, p, 32, _v(I16, L))) if kind == "q4_1" else None
            xoff, foff = b.mul(bi, _i64(32 * AB)), b.mul(bi, _i64(4))
            acc = [[zero] * chains for _ in range(RT)]
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
            if kind == "q8_0" and AB == 1:  # codes + 128 (u8) by the token's int8 codes
                for j in range(8):
                    wv = _load(b, p, 32 + 64 * j, v16i)  # lane l: row l's columns 4j..4j + 3
                    for s in range(RT):
                        quad(s, j % chains, wv, 4 * j)
                for s in range(RT):  # less 128 x the block's code sum: the codes' products
                    xsum = _splat(b, _load(b, irows[s], foff, I32), L)
                    acc[s][0] = b.sub(acc[s][0], b.shl(xsum, _c(v16i, [7] * L)))
            if kind == "q8_0" and AB == 2:
                for j in range(16):
                    wv = b.bitcast(b.sext(_load(b, p, 32 + 32 * j, _v(I8, 2 * L)), v32w), v16i)
                    for s in range(RT):
                        step(s, j % chains, wv, j)
            if kind != "q8_0" and AB == 1:  # byte layout: quadruples, vpdpbusd
                nib = _c(v16i, [0x0F0F0F0F] * L)
                for c in range(4):
                    v = _load(b, p, q0 + 64 * c, v16i)
                    for h, u in enumerate((v, b.lshr(v, _c(v16i, [4] * L)))):
                        wv = b.and_(u, nib)  # lane l: row l's columns 8c + 4h + k, k < 4
                        for s in range(RT):
                            quad(s, (2 * c + h) % chains, wv, 8 * c + 4 * h)
            if kind != "q8_0" and AB == 2:  # word layout: nibble pairs, vpdpwssd
                for c in range(4):
                    v = _load(b, p, q0 + 64 * c, v32w)
                    for s4 in range(4):
                        u = b.lshr(v, _c(v32w, [4 * s4] * (2 * L))) if s4 else v
                        wv = b.bitcast(b.and_(u, low) if s4 < 3 else u, v16i)
                        j = 4 * c + s4
                        for s in range(RT):
                            step(s, j % chains, wv, j)
            new = []
            for s in range(RT):
                tot = acc[s][0]
                for a in acc[s][1:]:
                    tot = b.add(tot, a)
                new.append(_scale(b, kind, AB, tot, drows[s], srows[s], foff, dw, mw, st[s]))
            return new

        group_blocks(b, b.sdiv(xq.cols, _i64(32)), RT, body, out, t, i, range(L), chains=2)
        return ctx.get_dummy_value()

    return codegen


def make_itile(kind, RT):
    """The intrinsic itile_<kind>_16x<RT> (tiles.py)."""
    arrays = {0: types.uint8, 2: (types.int8, types.int16), 3: types.float32,
              4: types.int32, 5: types.float32, 7: types.float32}
    return _typed(f"itile_{kind}_16x{RT}", _itile_codegen(kind, RT), arrays, ints=(1, 6, 8))
