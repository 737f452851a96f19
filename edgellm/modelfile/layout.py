"""How a quantized matrix's blocks are ordered in the file: by rows, or interleaved 16 rows a
group (`X16`), the layout the integer kernels read fastest (kernels/interleave.py's tiles:
one weight row a <16 x i32> lane, so no horizontal sums).

  rows  (""; every file before version 3) uint8 [rows, nb * BB]: ggml's blocks, rows
        contiguous (quant.py)
  x16   uint8 [rows / 16, nb * 16 * BB], for q4_0, q4_1, q5_0, q5_1 and q8_0 with blocks
        of 32 and rows a multiple of 16; group g holds rows 16g..16g+15, per block of 32
        columns (q4, q5):
          the 16 rows' f16 d (32 bytes), (q4_1, q5_1) their 16 f16 m (32 bytes), (q5)
          their 32 fifth bits as a 4-byte word each (64 bytes), permuted (QH_PERM), then
          4 chunks of 64 bytes: byte 4l + k of chunk c holds row l's codes at columns
          8c + k (low nibble) and 8c + 4 + k (high nibble), k = 0..3
        So a chunk loaded as <16 x i32> is, lane l, row l's codes at 8 columns: masked
        to its low nibbles, four unsigned bytes for columns 8c..8c+3 (one vpdpbusd /
        sdot with four int8 activations); its words masked to 0x000F000F, i16 pairs of
        columns (8c + k, 8c + k + 2) for vpdpwssd on int16 activations (the tile reads
        the activation pairs in that order). The bytes are the rows' bytes rearranged:
        the same codes and scales, the same values bit for bit (`to_rows` undoes it).
        q8_0, per block of 32 columns (16 x 34 bytes): the 16 rows' f16 d (32 bytes),
        then 16 chunks of 32 bytes: bytes 2l, 2l + 1 of chunk j are row l's codes at
        columns 2j, 2j + 1 (sign-extended to <32 x i16>, lane l is row l's i16 pair for
        vpdpwssd on int16 activations; kernels/interleave.py's q8_0 tiles)
        q4_k (super-blocks of 256, K % 256 == 0), per super-block of the group (16 x 144
        bytes): the 16 rows' f16 d (32 bytes), their f16 dmin (32), their 12 scale bytes
        (192: byte k of row l at 16k + l, so ggml's get_scale_min_k4 runs on 16 rows in
        byte vectors), then 32 chunks of 64 bytes: bytes 4l..4l + 3 of chunk 8c + m hold
        row l's qs[32c + 4m .. 32c + 4m + 3] (low nibbles: columns 64c + 4m + k, block
        2c; high: 64c + 32 + 4m + k, block 2c + 1), the lanes kernels/x16_k.py reads
        q6_k (16 x 210 bytes a super-block): the 16 rows' f16 d (32 bytes), their 16 int8
        scales (256: byte k of row l at 16k + l), then 16 units of three 64-byte chunks,
        unit 8h + m: ql's chunks 16h + m and 16h + m + 8, qh's 8h + m, where ql's chunk u
        (qh's alike) holds row l's ql[4u..4u + 3] at bytes 4l..4l + 3: ggml's bytes, four
        at a time a lane, in the order the tiles read them
Rows r0..r1 (multiples of 16) of an x16 matrix lie at bytes r0 * BB * nb .. r1 * BB * nb,
where the rows layout keeps them too.
"""

from __future__ import annotations

import numpy as np

from . import quant

ROWS, X16 = "", "x16"
LAYOUTS = (ROWS, X16)
GROUP_ROWS = 16
# the types the x16 tiles read (kernels/interleave.py, kernels/x16_k.py), at these block sizes
X16_BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "q4_k": 256,
             "q6_k": 256}
X16_TYPES = tuple(X16_BLOCK)
X16_SB = ("q4_k", "q6_k")  # those whose x16 kernels take super-block activations (act_quant_k)
SB_BYTES = {"q4_k": 144, "q6_k": 210}  # a super-block's bytes
# q6_k's group super-block: d and the scales (288 bytes), then its 48 code chunks of 64
# bytes unit by unit (h, m) (x16_k.py): ql's chunks 16h + m and 16h + m + 8, qh's 8h + m
Q6K_HEAD = 288
Q6K_UNITS = [c for h in range(2) for m in range(8) for c in (16 * h + m, 16 * h + m + 8,
                                                             32 + 8 * h + m)]


X16_Q5 = ("q5_0", "q5_1")  # q4's layout plus each row's 32 high bits, permuted (QH_PERM)
# bit p of a q5 row's permuted high-bit word holds column QH_PERM[p]'s fifth bit: bit 8k + c
# column 8c + k, bit 8k + 4 + c column 8c + 4 + k (k, c < 4), so chunk c's low codes' bits
# are (word << (4 - c)) & 0x10101010 and its high codes' (word >> c) & 0x10101010
QH_PERM = [8 * c + k + 4 * h for k in range(4) for h in range(2) for c in range(4)]


def _qh_bits(qh: np.ndarray) -> np.ndarray:
    """uint8 [..., 4] little-endian words -> their 32 bits [..., 32] (bit j at j)."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")


def _qh_word(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits, axis=-1, bitorder="little")


def fits_x16(type_name: str, shape: tuple[int, ...], block_size: int) -> bool:
    """Whether a tensor of this type, shape and block size can be stored in x16."""
    block = X16_BLOCK.get(type_name)
    return (block is not None and block_size == block and len(shape) == 2
            and shape[0] % GROUP_ROWS == 0 and shape[1] % block == 0)


def data_shape(type_name: str, shape: tuple[int, ...], block_size: int, layout: str
               ) -> tuple[int, int]:
    """The uint8 array a quantized tensor's bytes are viewed as in `layout`."""
    rb = quant.TYPES[type_name].row_bytes(shape[-1], block_size)
    rows = int(np.prod(shape[:-1]))
    if layout == X16:
        return rows // GROUP_ROWS, GROUP_ROWS * rb
    return rows, rb


def to_x16(w: np.ndarray, kind: str) -> np.ndarray:
    """q4_0 / q4_1 / q5_0 / q5_1 / q8_0 / q4_k / q6_k rows (uint8 [rows, nb * BB], rows a
    multiple of 16) -> uint8 [rows / 16, nb * 16 * BB] (the module docstring)."""
    if kind in X16_SB:
        return _to_x16_sb(w, kind)
    if kind == "q8_0":
        return _to_x16_q8(w)
    hdr = quant.TYPES[kind].header_bytes
    BB = quant.TYPES[kind].block_bytes(32)
    rows, nb = w.shape[0], w.shape[1] // BB
    if rows % GROUP_ROWS or w.shape[1] != nb * BB:
        raise ValueError(f"x16: {kind} rows {list(w.shape)} are not groups of 16 rows of "
                         "whole blocks")
    G = rows // GROUP_ROWS
    blk = np.asarray(w, np.uint8).reshape(G, GROUP_ROWS, nb, BB)
    parts = [blk[..., f:f + 2].transpose(0, 2, 1, 3).reshape(G, nb, 32)
             for f in range(0, hdr, 2)]  # the 16 rows' d, then (q4_1, q5_1) their m
    if kind in X16_Q5:  # the 16 rows' high-bit words, permuted
        qh = _qh_word(_qh_bits(blk[..., hdr:hdr + 4])[..., QH_PERM])
        parts.append(qh.transpose(0, 2, 1, 3).reshape(G, nb, 64))
        hdr += 4
    q = blk[..., hdr:]  # byte i: columns i (low nibble), 16 + i (high)
    cb = np.concatenate([q & 15, q >> 4], axis=-1).reshape(G, GROUP_ROWS, nb, 4, 2, 4)
    quads = (cb[..., 0, :] | cb[..., 1, :] << 4).transpose(0, 2, 3, 1, 4)  # g, b, c, l, k
    parts.append(quads.reshape(G, nb, 256))
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).reshape(G, -1))


def to_rows(wi: np.ndarray, kind: str) -> np.ndarray:
    """The inverse of to_x16: uint8 [G, nb * 16 * BB] -> the rows [16 G, nb * BB]."""
    if kind in X16_SB:
        return _to_rows_sb(wi, kind)
    if kind == "q8_0":
        return _to_rows_q8(wi)
    hdr = quant.TYPES[kind].header_bytes
    BB = quant.TYPES[kind].block_bytes(32)
    G = wi.shape[0]
    nb = wi.shape[1] // (GROUP_ROWS * BB)
    grp = np.asarray(wi, np.uint8).reshape(G, nb, GROUP_ROWS * BB)
    heads = [grp[..., 32 * f:32 * f + 32].reshape(G, nb, GROUP_ROWS, 2)
             for f in range(hdr // 2)]
    if kind in X16_Q5:  # the permuted words back to ggml's qh
        qh = grp[..., 16 * hdr:16 * hdr + 64].reshape(G, nb, GROUP_ROWS, 4)
        bits = _qh_bits(qh)
        heads.append(_qh_word(bits[..., np.argsort(QH_PERM)]))
        hdr += 4
    quads = grp[..., 16 * hdr:].reshape(G, nb, 4, GROUP_ROWS, 4)  # g, b, c, l, k
    cols = np.stack([quads & 15, quads >> 4], axis=3)  # g, b, c, half, l, k: 8c + 4 half + k
    cols = cols.transpose(0, 4, 1, 2, 3, 5).reshape(G, GROUP_ROWS, nb, 32)
    codes = cols[..., :16] | cols[..., 16:] << 4
    blk = np.concatenate([h.transpose(0, 2, 1, 3) for h in heads] + [codes], axis=-1)
    return np.ascontiguousarray(blk.reshape(G * GROUP_ROWS, nb * BB))


def _to_x16_q8(w: np.ndarray) -> np.ndarray:
    rows, nb = w.shape[0], w.shape[1] // 34
    if rows % GROUP_ROWS or w.shape[1] != nb * 34:
        raise ValueError(f"x16: q8_0 rows {list(w.shape)} are not groups of 16 rows of "
                         "whole blocks")
    G = rows // GROUP_ROWS
    blk = np.asarray(w, np.uint8).reshape(G, GROUP_ROWS, nb, 34)
    d = blk[..., 0:2].transpose(0, 2, 1, 3).reshape(G, nb, 32)  # the 16 rows' f16 d
    q = blk[..., 2:].reshape(G, GROUP_ROWS, nb, 16, 2).transpose(0, 2, 3, 1, 4)  # g b j l
    return np.ascontiguousarray(np.concatenate([d, q.reshape(G, nb, 512)], -1).reshape(G, -1))


def _to_rows_q8(wi: np.ndarray) -> np.ndarray:
    G, nb = wi.shape[0], wi.shape[1] // (GROUP_ROWS * 34)
    grp = np.asarray(wi, np.uint8).reshape(G, nb, GROUP_ROWS * 34)
    d = grp[..., :32].reshape(G, nb, GROUP_ROWS, 2).transpose(0, 2, 1, 3)
    q = grp[..., 32:].reshape(G, nb, 16, GROUP_ROWS, 2).transpose(0, 3, 1, 2, 4)
    blk = np.concatenate([d, q.reshape(G, GROUP_ROWS, nb, 32)], -1)
    return np.ascontiguousarray(blk.reshape(G * GROUP_ROWS, nb * 34))


def _sb_parts(kind: str) -> list[tuple[int, int, int]]:
    """A super-block row's parts as the x16 group stores them, in order: (offset in the
    row's bytes, bytes, bytes a lane takes at a time: 2 for the f16 scales, 1 for the scale
    bytes (byte k of the 16 rows side by side), 4 for the codes (64-byte chunks))."""
    if kind == "q4_k":  # d, dmin, 12 scale bytes, 128 code bytes
        return [(0, 2, 2), (2, 2, 2), (4, 12, 1), (16, 128, 4)]
    return [(208, 2, 2), (192, 16, 1), (0, 128, 4), (128, 64, 4)]  # q6_k: d, sc, ql, qh


def _to_x16_sb(w: np.ndarray, kind: str) -> np.ndarray:
    SB, R = SB_BYTES[kind], GROUP_ROWS
    rows, nsb = w.shape[0], w.shape[1] // SB
    if rows % R or w.shape[1] != nsb * SB:
        raise ValueError(f"x16: {kind} rows {list(w.shape)} are not groups of 16 rows of "
                         "whole super-blocks")
    G = rows // R
    blk = np.asarray(w, np.uint8).reshape(G, R, nsb, SB).transpose(0, 2, 1, 3)  # g, s, l, byte
    parts = [blk[..., o:o + n].reshape(G, nsb, R, n // u, u).transpose(0, 1, 3, 2, 4)
             .reshape(G, nsb, R * n) for o, n, u in _sb_parts(kind)]
    sb = np.concatenate(parts, axis=-1)
    if kind == "q6_k":  # the code chunks in the order the tiles read them (one stream)
        sb = _reorder(sb, Q6K_UNITS)
    return np.ascontiguousarray(sb.reshape(G, -1))


def _reorder(sb: np.ndarray, order: list[int]) -> np.ndarray:
    """The group super-blocks [G, nsb, bytes] with their 64-byte code chunks (after the
    scales' Q6K_HEAD bytes) permuted: chunk k of the result is chunk order[k]."""
    head, chunks = sb[..., :Q6K_HEAD], sb[..., Q6K_HEAD:]
    chunks = chunks.reshape(*sb.shape[:2], -1, 64)[:, :, order]
    return np.concatenate([head, chunks.reshape(*sb.shape[:2], -1)], axis=-1)


def _to_rows_sb(wi: np.ndarray, kind: str) -> np.ndarray:
    SB, R = SB_BYTES[kind], GROUP_ROWS
    G, nsb = wi.shape[0], wi.shape[1] // (R * SB)
    grp = np.asarray(wi, np.uint8).reshape(G, nsb, R * SB)
    if kind == "q6_k":
        grp = _reorder(grp, list(np.argsort(Q6K_UNITS)))
    out = np.empty((G, nsb, R, SB), np.uint8)
    at = 0
    for o, n, u in _sb_parts(kind):
        out[..., o:o + n] = grp[..., at:at + R * n].reshape(G, nsb, n // u, R, u) \
            .transpose(0, 1, 3, 2, 4).reshape(G, nsb, R, n)
        at += R * n
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3).reshape(G * R, nsb * SB))


def rows_of(data: np.ndarray, type_name: str, layout: str) -> np.ndarray:
    """A tensor's stored bytes as rows (a copy for x16: for tests, tools, small tensors)."""
    return to_rows(data, type_name) if layout == X16 else data
