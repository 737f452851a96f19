"""Code generators of the float-activation tiles (precise mode) and the dequantized row.

ftile: RW weight rows x RT float32 activation rows, each weight block dequantized in
registers (quantized types) or read as f32 / f16 values; row: one weight row dequantized
into out[t] (the embedding lookup). `make_ftile`, `make_row` make the intrinsics
(tiles.py names them).
"""

from __future__ import annotations

from numba import types

from .ir import (
    F32,
    FAST,
    I8,
    I16,
    _c,
    _drop_block,
    _f16,
    _for,
    _h2f,
    _hsum,
    _i64,
    _load,
    _loop,
    _nibbles,
    _pick,
    _Rows,
    _splat,
    _store,
    _typed,
    _v,
)
from .packing import BLOCK_BYTES, affine, block_layout, by_block_of, signed, weights, zero

__all__ = ["make_ftile", "make_row"]

_WEIGHT_DTYPE = {"f32": types.float32, "f16": types.uint16}  # quantized: uint8
NACC = 2  # accumulators per output: breaks the multiply-add dependency chain


def _dequant(b, kind, p, B, scaled=True):
    """Weight block at p as <16 x f32> chunks of dequantized values.

    scaled=False (not affine: q8_0, q4_0, iq4_nl): the integer values (w, or q - zero),
    and the scale apart: returns (chunks, <16 x f32> scale).
    """
    hdr, _ = block_layout(kind, B)
    dwv = _splat(b, _f16(b, p, 0), 16)
    if signed(kind):  # int8 weights: the bytes, or the table's levels
        qs = [b.sitofp(weights(b, kind, p, 16, 16 * c), _v(F32, 16)) for c in range(B // 16)]
    else:
        full = _nibbles(b, p, hdr, B)
        if zero(kind):
            full = b.sub(full, _c(_v(I8, B), [zero(kind)] * B))
        conv = b.sitofp if zero(kind) else b.uitofp
        qs = [conv(_pick(b, full, range(16 * c, 16 * c + 16)), _v(F32, 16))
              for c in range(B // 16)]
    if not scaled:
        assert not affine(kind)
        return qs, dwv
    chunks = [b.fmul(q, dwv, flags=FAST) for q in qs]
    if affine(kind):
        mv = _splat(b, _f16(b, p, 2), 16)
        chunks = [b.fadd(c, mv, flags=FAST) for c in chunks]
    return chunks


def _unit(kind, B):
    """(quantized, bytes, columns) of one loop step over a weight row: a block of B
    (quantized kinds) or 16 f32/f16 values."""
    if kind in BLOCK_BYTES:
        return True, block_layout(kind, B)[1], B
    return False, (4 if kind == "f32" else 2) * 16, 16


def _chunks(b, kind, p, B):
    """The weight step at p as <16 x f32> chunks: a block dequantized, or 16 float values."""
    if kind in BLOCK_BYTES:
        return _dequant(b, kind, p, B)
    if kind == "f32":
        return [_load(b, p, 0, _v(F32, 16))]
    return [_h2f(b, _load(b, p, 0, _v(I16, 16)))]


def _scalar(b, kind, row, k):
    """Float weight k of a f32/f16 row as f32 (the K % 16 leftover columns)."""
    if kind == "f32":
        return _load(b, row, b.mul(k, _i64(4)), F32)
    return _h2f(b, _load(b, row, b.mul(k, _i64(2)), I16))


def _f32act_codegen(kind, B, RW, RT):
    """Tile for float activations. kind: q8_0/q4_0/q4_1 (block B) or f32/f16 (B unused)."""
    quantized, BB, step = _unit(kind, B)

    def codegen(ctx, b, sig, args):
        w, x, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 4))
        i, t = args[1], args[3]
        K = x.cols
        nb = b.sdiv(K, _i64(step))
        wrow = [w.row(b.add(i, _i64(r))) for r in range(RW)]
        xrow = [x.row(b.add(t, _i64(r))) for r in range(RT)]
        n = RW * RT
        zero16 = _c(_v(F32, 16), [0.0] * 16)

        # one token: sum q . x over the block first, then one multiply-add by the scale
        sum_first = RT == 1 and quantized and not affine(kind)

        def body(bi, st):
            acc = list(st)
            for r in range(RW):
                p = b.gep(wrow[r], [b.mul(bi, _i64(BB))], inbounds=True)
                if sum_first:
                    qs, dwv = _dequant(b, kind, p, B, scaled=False)
                    xb = b.mul(bi, _i64(step * 4))
                    dot = None
                    for c, q in enumerate(qs):
                        xc = _load(b, xrow[0], b.add(xb, _i64(64 * c)), _v(F32, 16))
                        prod = b.fmul(q, xc, flags=FAST)
                        dot = prod if dot is None else b.fadd(dot, prod, flags=FAST)
                    j = r * NACC
                    acc[j] = b.fadd(acc[j], b.fmul(dot, dwv, flags=FAST), flags=FAST)
                    continue
                wf = _chunks(b, kind, p, B)
                for s in range(RT):
                    xb = b.mul(bi, _i64(step * 4))
                    for c, wc in enumerate(wf):
                        xc = _load(b, xrow[s], b.add(xb, _i64(64 * c)), _v(F32, 16))
                        j = (r * RT + s) * NACC + c % NACC
                        acc[j] = b.fadd(acc[j], b.fmul(wc, xc, flags=FAST), flags=FAST)
            return acc

        unroll = 2 if (n == 1 and (not quantized or B == 32)) else 1
        states = _loop(b, nb, [zero16] * (n * NACC), body, unroll=unroll)
        final = states[0]
        for st in states[1:]:
            final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
        tails = [_c(F32, 0.0)] * n
        if not quantized:  # K % 16 leftover columns, scalar
            def tail(k, st):
                st = list(st)
                for r in range(RW):
                    wk = _scalar(b, kind, wrow[r], k)
                    for s in range(RT):
                        xk = _load(b, xrow[s], b.mul(k, _i64(4)), F32)
                        j = r * RT + s
                        st[j] = b.fadd(st[j], b.fmul(wk, xk, flags=FAST), flags=FAST)
                return st
            tails = _for(b, b.mul(nb, _i64(16)), K, tails, tail)
        for r in range(RW):
            for s in range(RT):
                j = r * RT + s
                v = final[j * NACC]
                for a in range(1, NACC):
                    v = b.fadd(v, final[j * NACC + a], flags=FAST)
                res = b.fadd(_hsum(b, v), tails[j], flags=FAST)
                _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)), res)
        return ctx.get_dummy_value()

    return codegen


def _dequant_row_codegen(kind, B):
    """Codegen of row(W, i, OUT, t): out[t, :] = dequantized row i of W (embedding)."""
    quantized, BB, step = _unit(kind, B)

    def codegen(ctx, b, sig, args):
        w, out = _Rows(ctx, b, sig.args[0], args[0]), _Rows(ctx, b, sig.args[2], args[2])
        wrow, orow = w.row(args[1]), out.row(args[3])
        D = out.cols

        def body(bi, st):
            p = b.gep(wrow, [b.mul(bi, _i64(BB))], inbounds=True)
            chunks = _chunks(b, kind, p, B)
            for c, v in enumerate(chunks):
                q = b.gep(orow, [b.add(b.mul(bi, _i64(step * 4)), _i64(64 * c))], inbounds=True)
                b.store(v, b.bitcast(q, v.type.as_pointer()), align=4)
            return st

        nb = b.sdiv(D, _i64(step))
        _for(b, _i64(0), nb, [], body)
        if not quantized:
            def tail(k, st):
                v = _scalar(b, kind, wrow, k)
                q = b.gep(orow, [b.mul(k, _i64(4))], inbounds=True)
                b.store(v, b.bitcast(q, F32.as_pointer()), align=4)
                return st
            _for(b, b.mul(nb, _i64(16)), D, [], tail)
        return ctx.get_dummy_value()

    return codegen



def make_ftile(kind, RW, RT):
    """The intrinsic ftile_<kind>_<RW>x<RT>(W, block, i, x, t, out) (tiles.py)."""
    name = f"ftile_{kind}_{RW}x{RT}"
    if kind in BLOCK_BYTES:
        codegen = by_block_of(kind, lambda B: _f32act_codegen(kind, B, RW, RT))
    else:
        codegen = _drop_block(_f32act_codegen(kind, 0, RW, RT))
    arrays = {0: _WEIGHT_DTYPE.get(kind, types.uint8), 3: types.float32, 5: types.float32}
    return _typed(name, codegen, arrays, ints=(1, 2, 4))


def make_row(kind):
    """The intrinsic row_<kind>(W, block, i, out, t): out[t] = row i dequantized."""
    name = f"row_{kind}"
    if kind in BLOCK_BYTES:
        codegen = by_block_of(kind, lambda B: _dequant_row_codegen(kind, B))
    else:
        codegen = _drop_block(_dequant_row_codegen(kind, 0))
    arrays = {0: _WEIGHT_DTYPE.get(kind, types.uint8), 3: types.float32}
    return _typed(name, codegen, arrays, ints=(1, 2, 4))
