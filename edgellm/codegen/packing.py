"""A sized type's block as the code generators read it: quant.TYPES' `packing` (quant.Packing).

The generators (int8_tiles.py, float_tiles.py, kernels/panel.py's pack) ask these, never a
type's name: the three forms of a block's value
  signed   d w, w an int8 weight `weights` decodes in the tile: q8_0's bytes, a table's
           level for each code (iq4_nl), or q - zero of codes other than nibbles; run as
           q8_0's tiles, packed into q8_0's panels
  zero     d (q - zero) of nibbles (q4_0): the offset folded in per block, - zero d xds
  affine   d q + m of nibbles (q4_1): + m xds per block
and where a block's parts are (`block_layout`, `codes`). A new plane of codes (not int8
bytes or nibbles) is a branch in `codes` here and in quant.Packing.codes_of.
"""

from __future__ import annotations

from ..modelfile import quant
from ..runtime.simd import VNNI
from .ir import I8, _by_block, _c, _dot_us, _llvm_fn, _load, _nibbles, _pick, _signed_dot, _v

__all__ = ["BLOCK_BYTES", "PACKING", "affine", "block_layout", "by_block_of", "codes",
           "lookup", "signed", "weight_dot", "weights", "zero"]

# the types whose tiles the generators make from their packing
PACKING = {n: t.packing for n, t in quant.TYPES.items() if t.packing}
# (header bytes, block bytes at B = 32) of each of them (block_layout: at any B)
BLOCK_BYTES = {n: (t.header_bytes, t.block_bytes(32)) for n, t in quant.TYPES.items()
               if t.packing}


def block_layout(kind, B=32) -> tuple[int, int]:
    """(header bytes, bytes of a block of B) of a packed type: the codes start after the
    header."""
    t = quant.TYPES[kind]
    return t.header_bytes, t.block_bytes(B)


def signed(kind) -> bool:
    """value d w with w the block's int8 weights (q8_0's bytes, iq4_nl's levels):
    `weights` reads them."""
    return kind in PACKING and PACKING[kind].signed


def affine(kind) -> bool:
    """value d q + m: the f16 minimum m at byte 2 of the block (q4_1)."""
    return kind in PACKING and PACKING[kind].affine


def zero(kind) -> int:
    """value d (q - zero) (q4_0: 8), 0 for the other forms."""
    return PACKING[kind].zero if kind in PACKING else 0


def weight_dot(b, kind, w):
    """dot(x) -> partial sums of w . x for int8 activation vectors x (w's lane count)."""
    if not signed(kind):  # unsigned nibbles
        def dot(x):
            return _dot_us(b, w, x)
        return dot
    return _signed_dot(b, w)


def codes(b, kind, p, B=32):
    """The B codes q of a packed type's block at p as <B x i8> (quant.Packing.codes: a new
    plane of codes is a branch here and one in Packing.codes_of)."""
    pk = PACKING[kind]
    if pk.codes == "nibbles":
        return _nibbles(b, p, pk.header_bytes, B)
    if pk.codes == "int8":
        return _load(b, p, pk.header_bytes, _v(I8, B))
    raise NotImplementedError(f"{kind}: no code generator reads {pk.codes!r} codes")


def weights(b, kind, p, n=32, off=0):
    """Elements off..off+n-1 of a signed type's block at p as <n x i8> int8 weights w (value
    d w): the int8 bytes as stored, else (blocks of 32) each code's level in the packing's
    table, or q - zero."""
    pk = PACKING[kind]
    if pk.codes == "int8":  # (any block size)
        return _load(b, p, pk.header_bytes + off, _v(I8, n))
    q = codes(b, kind, p)
    if n != 32:
        q = _pick(b, q, range(off, off + n))
    if pk.table:
        return lookup(b, q, pk.table)
    return b.sub(q, _c(_v(I8, n), [pk.zero] * n))


def lookup(b, codes, table):
    """<n x i8> codes 0..len(table)-1 -> their int8 levels table[code]: one vpshufb on the
    VNNI path (x86 with AVX-512), else one compare and select a level (generic IR)."""
    n = codes.type.count
    if VNNI and len(table) == 16 and n in (16, 32, 64):
        name = {16: "llvm.x86.ssse3.pshuf.b.128", 32: "llvm.x86.avx2.pshuf.b",
                64: "llvm.x86.avx512.pshuf.b.512"}[n]
        vt = _v(I8, n)
        return b.call(_llvm_fn(b, name, vt, [vt, vt]), [_c(vt, list(table) * (n // 16)), codes])
    out = _c(_v(I8, n), [table[0]] * n)
    for k, level in enumerate(table[1:], 1):
        hit = b.icmp_unsigned("==", codes, _c(_v(I8, n), [k] * n))
        out = b.select(hit, _c(_v(I8, n), [level] * n), out)
    return out


def _nothing(ctx, b, sig, args):
    return ctx.get_dummy_value()


def by_block_of(kind, make):
    """_by_block for type `kind`: make(B) for the block sizes it is stored in, nothing for
    the others (never called: the loader checks a tensor's block size against its type)."""
    blocks = quant.TYPES[kind].blocks
    return _by_block(lambda B: make(B) if B in blocks else _nothing)
