"""ggml's K-quants (and q5_0) in numpy: the reference quantize and dequantize.

Each K type stores super-blocks of QK_K = 256 values in ggml's own bytes (ggml-common.h),
so GGUF tensors are used as they are. Every type is read the same way, as codes q and
per-16-value scales: value = dsub[j] * q - msub[j] for the 16 values of sub-block j
(`parts`). That is the decomposition the kernels use (kernels/kquant.py), and dequantize
is exactly it (the same float32 products as the gguf package's dequantization):

  q2_k  84 B: [16 scales: low 4 bits sc, high 4 bits m][64 B of 2-bit q][f16 d][f16 dmin]
              dsub = d sc, msub = dmin m, q 0..3
  q3_k 110 B: [32 B hmask][64 B of 2-bit low q][12 B of 6-bit scales][f16 d]
              dsub = d (sc - 32), msub = 0, q = low - 4 where the hmask bit is clear, -4..3
  q4_k 144 B: [f16 d][f16 dmin][12 B of 6-bit scales and mins, 8 sub-blocks of 32][128 B]
              dsub = d sc, msub = dmin m, q 0..15
  q5_k 176 B: q4_k's header, [32 B of high bits][128 B of low nibbles], q 0..31
  q6_k 210 B: [128 B low nibbles][64 B of 2-bit highs][16 int8 scales][f16 d]
              dsub = d sc, msub = 0, q = q6 - 32, -32..31
  q5_0  22 B (blocks of 32): [f16 d][u32 of high bits][16 B nibbles], value d (q - 16)
  q5_1  24 B (blocks of 32): [f16 d][f16 m][u32 of high bits][16 B nibbles], value d q + m
        (msub = -m: d q - (-m) is d q + m exactly)

Quantization follows llama.cpp's reference C code without an importance matrix
(`quantize_row_q*_K_ref`, `make_qx_quants`, `make_qkx2_quants`, `make_q3_quants`),
vectorized over blocks, in float32, with the C loops' sums taken in their order
(`_seq_sum`); `nearest_int` is round-half-to-even, as the C trick (x + 1.5 * 2**23) is.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)
F0 = np.float32(0)


# --- helpers ------------------------------------------------------------------------------

def _f16(raw: np.ndarray, off: int) -> np.ndarray:
    """uint8 [n, bytes] -> float32 [n, 1]: the little-endian f16 at byte off."""
    return raw[:, off:off + 2].copy().view("<f2").astype(np.float32)


def _to_f16(v: np.ndarray) -> np.ndarray:
    """float32 [n] -> (f16 bytes uint8 [n, 2], the f16 value back as float32 [n])."""
    h = v.astype("<f2")
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _seq_sum(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis in order (a C loop's float32 accumulation, not pairwise)."""
    return np.cumsum(v, axis=-1, dtype=np.float32)[..., -1]


def _rint(v: np.ndarray) -> np.ndarray:
    """llama.cpp's nearest_int: round half to even, as int32."""
    return np.rint(v).astype(np.int32)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (np.float32(a) if np.isscalar(a) else a) / b


def _first_argmax_abs(x: np.ndarray) -> np.ndarray:
    """The value of largest |x| per row (the first one on ties, as `if (ax > amax)`)."""
    idx = np.abs(x).argmax(axis=-1)
    return np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]


# --- the C reference's searches, vectorized over groups [g, n] -----------------------------

def _make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1, NULL): (scale [g], L [g, n] in 0..2 nmax-1)."""
    vmax = _first_argmax_abs(x)
    amax = np.abs(vmax)
    zero = amax < GROUP_MAX_EPS
    safe = np.where(zero, np.float32(1), vmax)
    w = x * x

    def trial(iscale):
        lv = np.clip(_rint(iscale[:, None] * x), -nmax, nmax - 1)
        lf = lv.astype(np.float32)
        return lv, _seq_sum(w * x * lf), _seq_sum(w * lf * lf)

    iscale = np.float32(-nmax) / safe
    lv, sumlx, suml2 = trial(iscale)
    scale = np.where(suml2 != 0, _div(sumlx, np.where(suml2 != 0, suml2, 1)), F0)
    best = scale * sumlx
    L = lv
    for k in range(-9, 10):
        if k == 0:
            continue
        it = -(np.float32(nmax) + np.float32(0.1) * np.float32(k)) / safe
        lv2, slx, sl2 = trial(it.astype(np.float32))
        take = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(take[:, None], lv2, L)
        scale = np.where(take, _div(slx, np.where(sl2 > 0, sl2, 1)), scale).astype(np.float32)
        best = np.where(take, scale * slx, best).astype(np.float32)
    L = np.where(zero[:, None], 0, L + nmax)
    return np.where(zero, F0, scale).astype(np.float32), L


def _make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants: (scale [g], the_min [g] (>= 0), L [g, n] in 0..nmax)."""
    xmin = np.minimum(x.min(axis=-1), F0)
    xmax = x.max(axis=-1)
    sum_w = _seq_sum(weights)
    sum_x = _seq_sum(weights * x)
    flat = xmax == xmin
    rng = np.where(flat, np.float32(1), xmax - xmin)
    iscale = np.float32(nmax) / rng
    scale = np.float32(1) / iscale
    L = np.clip(_rint(iscale[:, None] * (x - xmin[:, None])), 0, nmax)

    def error(sc, mn, lv):
        diff = sc[:, None] * lv.astype(np.float32) + mn[:, None] - x
        diff = np.abs(diff) if use_mad else diff * diff
        return _seq_sum(weights * diff)

    best = error(scale, xmin, L)
    vmin = xmin  # the C loop goes on from the best minimum found so far
    for k in range(nstep + 1):
        span = np.where(flat, np.float32(1), xmax - vmin)
        it = (np.float32(rmin) + np.float32(rdelta) * np.float32(k) + np.float32(nmax)) / span
        la = np.clip(_rint(it[:, None] * (x - vmin[:, None])), 0, nmax)
        lf = la.astype(np.float32)
        sum_l = _seq_sum(weights * lf)
        sum_l2 = _seq_sum(weights * lf * lf)
        sum_xl = _seq_sum(weights * lf * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, np.float32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
        pos = this_min > 0
        this_min = np.where(pos, F0, this_min)
        this_scale = np.where(pos, _div(sum_xl, np.where(sum_l2 != 0, sum_l2, 1)), this_scale)
        cur = error(this_scale.astype(np.float32), this_min.astype(np.float32), la)
        take = ok & (cur < best)
        L = np.where(take[:, None], la, L)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale).astype(np.float32)
        vmin = np.where(take, this_min, vmin).astype(np.float32)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F0, scale).astype(np.float32)
    return scale, (-np.where(flat, xmin, vmin)).astype(np.float32), L


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants(n, nmax, x, L, do_rmse=true): (scale [g], L [g, n] in 0..2 nmax-1)."""
    vmax = _first_argmax_abs(x)
    zero = np.abs(vmax) < GROUP_MAX_EPS
    safe = np.where(zero, np.float32(1), vmax)
    iscale = np.float32(-nmax) / safe
    L = np.clip(_rint(iscale[:, None] * x), -nmax, nmax - 1)
    w = x * x
    lf = L.astype(np.float32)
    sumlx = _seq_sum(w * x * lf)
    suml2 = _seq_sum(w * lf * lf)
    active = ~zero
    for _ in range(5):
        changed = np.zeros(len(x), bool)
        for i in range(x.shape[1]):
            wi, xi, li = w[:, i], x[:, i], L[:, i].astype(np.float32)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            ok = active & (slx > 0)
            new_l = np.clip(_rint(_div(xi * sl2, np.where(ok, slx, 1))), -nmax, nmax - 1)
            nf = new_l.astype(np.float32)
            ok &= new_l != L[:, i]
            slx2 = slx + wi * xi * nf
            sl22 = sl2 + wi * nf * nf
            take = ok & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(take, new_l, L[:, i])
            sumlx = np.where(take, slx2, sumlx).astype(np.float32)
            suml2 = np.where(take, sl22, suml2).astype(np.float32)
            changed |= take
        active &= changed
        if not active.any():
            break
    scale = np.where(zero, F0, _div(sumlx, np.where(suml2 != 0, suml2, 1)))
    return scale.astype(np.float32), np.where(zero[:, None], 0, L + nmax)


# --- per-type parts (codes and per-16 scales) ----------------------------------------------

def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes of q4_k / q5_k scales [n, 12] -> (sc [n, 8], m [n, 8]), get_scale_min_k4."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    s = np.concatenate([d & 63, (md & 15) | ((d >> 6) << 4)], axis=1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=1)
    return s, mn


def _bits(v: np.ndarray, shifts) -> np.ndarray:
    """[n, L] bytes -> [n, len(shifts), L]: (v >> s) for each shift."""
    return np.stack([v >> np.uint8(s) for s in shifts], axis=1)


def _parts_q2_k(r):
    sc = r[:, 0:16]
    q = (_bits(r[:, 16:80].reshape(-1, 2, 32), (0, 2, 4, 6)).transpose(0, 2, 1, 3)
         & 3).reshape(-1, 256)
    d, dmin = _f16(r, 80), _f16(r, 82)
    return q.astype(np.int8), d * (sc & 15).astype(np.float32), dmin * (sc >> 4).astype(np.float32)


def _q3_scales(s12: np.ndarray) -> np.ndarray:
    """12 bytes of q3_k scales [n, 12] -> the 16 6-bit scales [n, 16] (0..63, bias 32)."""
    low = np.concatenate([s12[:, 0:8] & 15, s12[:, 0:8] >> 4], axis=1)
    high = np.concatenate([(s12[:, 8:12] >> np.uint8(2 * k)) & 3 for k in range(4)], axis=1)
    return low | (high << 4)


def _parts_q3_k(r):
    hm = r[:, 0:32]
    low = (_bits(r[:, 32:96].reshape(-1, 2, 32), (0, 2, 4, 6)).transpose(0, 2, 1, 3)
           & 3).reshape(-1, 8, 32)
    high = np.stack([(hm >> np.uint8(k)) & 1 for k in range(8)], axis=1)  # [n, 8, 32]
    q = low.astype(np.int8) - ((1 - high) * 4).astype(np.int8)
    sc = _q3_scales(r[:, 96:108]).astype(np.int8) - np.int8(32)
    d = _f16(r, 108)
    return q.reshape(-1, 256), d * sc.astype(np.float32), np.zeros((len(r), 16), np.float32)


def _parts_q45_k(r, five: bool):
    d, dmin = _f16(r, 0), _f16(r, 2)
    sc, mn = _scale_min_k4(r[:, 4:16])
    qs = r[:, 48:176] if five else r[:, 16:144]
    q = np.stack([qs.reshape(-1, 4, 32) & 15, qs.reshape(-1, 4, 32) >> 4], axis=2)  # [n,4,2,32]
    q = q.reshape(-1, 8, 32)
    if five:
        q = q | (np.stack([(r[:, 16:48] >> np.uint8(k)) & 1 for k in range(8)], axis=1) << 4)
    dsub = np.repeat(d * sc.astype(np.float32), 2, axis=1)
    msub = np.repeat(dmin * mn.astype(np.float32), 2, axis=1)
    return q.reshape(-1, 256).astype(np.int8), dsub, msub


def _parts_q6_k(r):
    ql, qh = r[:, 0:128].reshape(-1, 2, 64), r[:, 128:192].reshape(-1, 2, 32)
    lo = np.stack([ql[:, :, :32] & 15, ql[:, :, 32:] & 15, ql[:, :, :32] >> 4,
                   ql[:, :, 32:] >> 4], axis=2)  # [n, 2, 4, 32]
    hi = np.stack([(qh >> np.uint8(2 * k)) & 3 for k in range(4)], axis=2)
    q = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    sc = r[:, 192:208].view(np.int8).astype(np.float32)
    return q.reshape(-1, 256), _f16(r, 208) * sc, np.zeros((len(r), 16), np.float32)


def _parts_q5_0(r):
    qh = r[:, 2:6].copy().view("<u4")  # [n, 1]
    hb = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    q = np.concatenate([r[:, 6:22] & 15, r[:, 6:22] >> 4], axis=1) | (hb << 4)
    d = np.repeat(_f16(r, 0), 2, axis=1)
    return q.astype(np.int8) - np.int8(16), d, np.zeros((len(r), 2), np.float32)


def _parts_q5_1(r):
    q, d, _ = _parts_q5_0(np.concatenate([r[:, 0:2], r[:, 4:24]], axis=1))
    return q + np.int8(16), d, -np.repeat(_f16(r, 2), 2, axis=1)


PARTS = {"q5_1": _parts_q5_1, "q2_k": _parts_q2_k, "q3_k": _parts_q3_k, "q4_k": lambda r: _parts_q45_k(r, False),
         "q5_k": lambda r: _parts_q45_k(r, True), "q6_k": _parts_q6_k, "q5_0": _parts_q5_0}


def parts(raw: np.ndarray, kind: str):
    """uint8 [n, block_bytes] -> (q int8 [n, B], dsub float32 [n, B/16], msub [n, B/16])."""
    return PARTS[kind](np.ascontiguousarray(raw, dtype=np.uint8))


def _dequantizer(kind):
    def dequantize_blocks(raw: np.ndarray) -> np.ndarray:
        shape = raw.shape
        q, dsub, msub = parts(raw.reshape(-1, shape[-1]), kind)
        g = q.reshape(len(q), -1, 16).astype(np.float32)
        v = dsub[:, :, None] * g - msub[:, :, None]
        return v.reshape(*shape[:-1], -1)
    return dequantize_blocks


# --- quantize -------------------------------------------------------------------------------

def _quantize_q6_k(x):
    n = len(x)
    g = x.reshape(-1, 16)
    scales, L = _make_qx_quants(g, 32)
    scales, L = scales.reshape(n, 16), L.reshape(n, 256)
    vmax = _first_argmax_abs(scales)
    zero = np.abs(vmax) < GROUP_MAX_EPS
    iscale = np.float32(-128) / np.where(zero, np.float32(1), vmax)
    dbytes, dval = _to_f16(np.where(zero, F0, np.float32(1) / iscale))
    isc = np.minimum(127, _rint(iscale[:, None] * scales))
    isc = np.where(zero[:, None], 0, isc)
    dsub = (dval[:, None] * isc.astype(np.float32))  # [n, 16]
    ok = dsub != 0
    lq = np.clip(_rint(_div(x.reshape(n, 16, 16), np.where(ok, dsub, 1)[:, :, None])), -32, 31)
    L = np.where(ok[:, :, None], lq + 32, L.reshape(n, 16, 16)).reshape(n, 2, 4, 32)
    L = np.where(zero[:, None, None, None], 0, L).astype(np.uint8)
    ql = np.concatenate([(L[:, :, 0] & 15) | ((L[:, :, 2] & 15) << 4),
                         (L[:, :, 1] & 15) | ((L[:, :, 3] & 15) << 4)], axis=2)  # [n, 2, 64]
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
          | ((L[:, :, 3] >> 4) << 6))  # [n, 2, 32]
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64),
                           isc.astype(np.int8).view(np.uint8), dbytes], axis=1)


def _pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [n, 8] -> q4_k's 12 bytes."""
    out = np.zeros((len(ls), 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    return out


def _quantize_q45_k(x, five: bool):
    n = len(x)
    nmax = 31 if five else 15
    g = x.reshape(-1, 32)
    av = np.sqrt(_seq_sum(g * g) / np.float32(32))
    weights = av[:, None] + np.abs(g)
    rmin, nstep = (-0.5, 15) if five else (-1.0, 20)
    scales, mins, L = _make_qkx2_quants(g, weights, nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale, max_min = np.maximum(scales.max(axis=1), F0), np.maximum(mins.max(axis=1), F0)
    inv_s = np.where(max_scale > 0, _div(np.float32(63), max_scale), F0)
    inv_m = np.where(max_min > 0, _div(np.float32(63), max_min), F0)
    ls = np.minimum(63, _rint(inv_s[:, None] * scales)).astype(np.uint8)
    lm = np.minimum(63, _rint(inv_m[:, None] * mins)).astype(np.uint8)
    db, dv = _to_f16(max_scale / np.float32(63))
    mb, mv = _to_f16(max_min / np.float32(63))
    d = dv[:, None] * ls.astype(np.float32)
    dm = mv[:, None] * lm.astype(np.float32)
    ok = d != 0
    xs = x.reshape(n, 8, 32)
    lq = np.clip(_rint(_div(xs + dm[:, :, None], np.where(ok, d, 1)[:, :, None])), 0, nmax)
    L = np.where(ok[:, :, None], lq, L.reshape(n, 8, 32)).astype(np.uint8).reshape(n, 4, 2, 32)
    parts_ = [db, mb, _pack_k_scales(ls, lm)]
    if five:
        high = (L >> 4) & 1  # [n, 4, 2, 32]: bit 2c of qh for the low half, 2c + 1 the high
        qh = np.zeros((n, 32), np.uint8)
        for c in range(4):
            qh |= (high[:, c, 0] << (2 * c)) | (high[:, c, 1] << (2 * c + 1))
        parts_.append(qh)
        L = L & 15
    parts_.append((L[:, :, 0] | (L[:, :, 1] << 4)).reshape(n, 128))
    return np.concatenate(parts_, axis=1)


def _quantize_q2_k(x):
    n = len(x)
    g = x.reshape(-1, 16)
    scales, mins, L = _make_qkx2_quants(g, np.abs(g), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(n, 16), mins.reshape(n, 16)
    max_scale, max_min = np.maximum(scales.max(axis=1), F0), np.maximum(mins.max(axis=1), F0)
    q4 = np.float32(15)
    isd = np.where(max_scale > 0, _div(q4, max_scale), F0)
    ism = np.where(max_min > 0, _div(q4, max_min), F0)
    ls = np.where(max_scale[:, None] > 0, _rint(isd[:, None] * scales), 0)
    lm = np.where(max_min[:, None] > 0, _rint(ism[:, None] * mins), 0)
    sc = (ls | (lm << 4)).astype(np.uint8)  # (the C stores them as uint8: wraps the same)
    db, dv = _to_f16(np.where(max_scale > 0, max_scale / q4, F0))
    mb, mv = _to_f16(np.where(max_min > 0, max_min / q4, F0))
    d = dv[:, None] * (sc & 15).astype(np.float32)
    dm = mv[:, None] * (sc >> 4).astype(np.float32)
    ok = d != 0
    xs = x.reshape(n, 16, 16)
    lq = np.clip(_rint(_div(xs + dm[:, :, None], np.where(ok, d, 1)[:, :, None])), 0, 3)
    L = np.where(ok[:, :, None], lq, L.reshape(n, 16, 16)).astype(np.uint8).reshape(n, 2, 4, 32)
    qs = L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)
    return np.concatenate([sc, qs.reshape(n, 64), db, mb], axis=1)


def _quantize_q3_k(x):
    n = len(x)
    g = x.reshape(-1, 16)
    scales, L = _make_q3_quants(g, 4)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    vmax = _first_argmax_abs(scales)
    nz = vmax != 0
    iscale = np.where(nz, _div(np.float32(-32), np.where(nz, vmax, 1)), F0)
    ls = np.where(nz[:, None], np.clip(_rint(iscale[:, None] * scales), -32, 31) + 32, 0)
    ls = ls.astype(np.uint8)  # 6-bit, 32 = zero
    s12 = np.zeros((n, 12), np.uint8)
    s12[:, 0:8] = (ls[:, 0:8] & 15) | ((ls[:, 8:16] & 15) << 4)
    for j in range(16):
        s12[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
    db, dv = _to_f16(np.where(nz, _div(np.float32(1), np.where(nz, iscale, 1)), F0))
    d = dv[:, None] * (_q3_scales(s12).astype(np.float32) - np.float32(32))
    ok = d != 0
    lq = np.clip(_rint(_div(x.reshape(n, 16, 16), np.where(ok, d, 1)[:, :, None])), -4, 3) + 4
    L = np.where(ok[:, :, None], lq, L).reshape(n, 256)
    high = L > 3
    L = np.where(high, L - 4, L).astype(np.uint8)
    # element j: hmask byte j % 32, bit j // 32
    hm = (high.reshape(n, 8, 32).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None])
    hmask = np.bitwise_or.reduce(hm, axis=1)
    L = L.reshape(n, 2, 4, 32)
    qs = L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)
    return np.concatenate([hmask, qs.reshape(n, 64), s12, db], axis=1)


def _quantize_q5_0(x):
    vmax = _first_argmax_abs(x)
    d = vmax / np.float32(-16)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), F0).astype(np.float32)
    db, _ = _to_f16(d)
    # MIN(31, (int8_t)(x * id + 16.5f)): truncation toward zero
    q = np.minimum(31, np.trunc(x * inv[:, None] + np.float32(16.5)).astype(np.int32))
    q = q.astype(np.uint8)
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    qh = (((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=1)
    return np.concatenate([db, qh.astype("<u4").view(np.uint8).reshape(-1, 4), qs], axis=1)


def _quantize_q5_1(x):
    vmin, vmax = x.min(axis=1), x.max(axis=1)
    d = (vmax - vmin) / np.float32(31)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), F0).astype(np.float32)
    db, _ = _to_f16(d)
    mb, _ = _to_f16(vmin)
    # (uint8_t)((x - min) * id + 0.5f): truncation
    q = np.trunc((x - vmin[:, None]) * inv[:, None] + np.float32(0.5)).astype(np.int32)
    q = q.astype(np.uint8)
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    qh = (((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=1)
    return np.concatenate([db, mb, qh.astype("<u4").view(np.uint8).reshape(-1, 4), qs], axis=1)


QUANTIZERS = {"q5_1": _quantize_q5_1, "q2_k": _quantize_q2_k, "q3_k": _quantize_q3_k,
              "q4_k": lambda x: _quantize_q45_k(x, False),
              "q5_k": lambda x: _quantize_q45_k(x, True), "q6_k": _quantize_q6_k,
              "q5_0": _quantize_q5_0}


def _quantizer(kind):
    def quantize_blocks(xb: np.ndarray) -> np.ndarray:
        shape = xb.shape
        flat = np.ascontiguousarray(xb, dtype=np.float32).reshape(-1, shape[-1])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            out = QUANTIZERS[kind](flat)
        return out.reshape(*shape[:-1], -1)
    return quantize_blocks


QUANTIZE_BLOCKS = {k: _quantizer(k) for k in QUANTIZERS}
DEQUANTIZE_BLOCKS = {k: _dequantizer(k) for k in PARTS}

# byte offsets of each block's f16 scales (d, and dmin where there is one)
F16_AT = {"q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,),
          "q5_0": (0,), "q5_1": (0, 2)}


def quantize_activations_k(x: np.ndarray, dtype=np.int16):
    """Reference super-block activations (q8_K's layout, kernels/act_quant_k.py): x float32
    [..., K] (K % 256 == 0) -> (xq int8 or int16 [..., K], xd float32 [..., K/256] = amax /
    127 or 32767 per 256 values, xb int32 [..., K/16]: the sum of each 16 integers). The
    rounding is q8_0's: sign(v) floor(|v| + 0.5), v = x / d (0 where d is 0)."""
    x = np.asarray(x, dtype=np.float32)
    qmax = np.float32(32767 if np.dtype(dtype) == np.int16 else 127)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // QK_K, QK_K)
    d = np.abs(xb).max(axis=-1) / qmax
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1) / d
    inv = np.where(np.isfinite(inv) & (d != 0), inv, np.float32(0)).astype(np.float32)
    v = xb * inv[..., None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(dtype)
    sums = q.astype(np.int32).reshape(*x.shape[:-1], x.shape[-1] // 16, 16).sum(axis=-1)
    return q.reshape(x.shape), d.astype(np.float32), sums.astype(np.int32)
