"""Searched quantizers: edgellm.modelfile.quant's block bytes, with better scales, minimums and codes.

`edgellm.modelfile.quant.quantize` (llama.cpp's reference rounding) scales each block by its largest
magnitude. Here each block's scale d (and, for q4_1, its minimum m) is searched to minimize
the weighted squared error  sum_i w_i (x_i - x^_i)^2  of the block, as llama.cpp's
`make_qx_quants` / `make_qkx2_quants` do for its k-quants and imatrix quantizers:

  1. a grid of candidate scales around max-abs (q8_0, q4_0) or (max - min) / 15 (q4_1);
     for each, round the codes, refit d (and m) by weighted least squares for those codes,
     and keep the candidate of least error;
  2. a few rounds of alternating refinement: codes rounded to the nearest level for the
     f16-rounded (d, m) (the best codes for them), then (d, m) refit for the codes;
  3. per block, the better of that and the reference rounding, measured with the f16
     values actually stored, so the weighted error is never larger than the reference's.

Importance of element j of a row: w_j = c_j, the mean of x_j^2 over the layer's inputs
(calibration statistics from converter/calibrate.py, llama.cpp's imatrix), so that the
search minimizes the expected squared error of the layer's output, sum_j err_j^2 E[x_j^2]
(for uncorrelated inputs); without calibration, w_j = 1 (plain squared error). llama.cpp
also multiplies by sqrt(mean x^2 of the row + x_ij^2); measured here on SmolLM2-135M, that
factor made perplexity worse, with and without calibration.

Block layouts are exactly edgellm.modelfile.quant's (the runtime kernels read them); only the choice
of d, m and codes differs. Vectorized numpy over all blocks of a row chunk.
"""

from __future__ import annotations

import numpy as np

from edgellm.errors import QuantizationError
from edgellm.modelfile import quant

QUANTIZERS = ("ref", "search", "gptq")
REFINE_ROUNDS = 2
SPAN = (0.7, 1.1, 9)  # candidate scales: fractions of the max-abs one (from, to, count)


def quantize(x: np.ndarray, type_name: str, block_size: int = quant.DEFAULT_BLOCK,
             name: str = "tensor", col_weights: np.ndarray | None = None) -> np.ndarray:
    """Quantize x [rows, cols] to uint8 [rows, row_bytes] blocks with searched scales.

    col_weights: optional importance per column [cols] (calibration: mean x^2 of the
    layer's inputs). Float types are converted as quant.quantize does.
    """
    t = quant.qtype(type_name)
    x = np.asarray(x)
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise QuantizationError(f"tensor {name}: {bad} NaN or infinite values")
    if not t.quantized:
        return quant.quantize(x, type_name, block_size, name=name)
    quant.check_quantizable(name, x.shape, block_size)
    rows, cols = x.shape
    xb = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block_size)
    w = importance(x, block_size, col_weights, name)
    lo, hi = t.codes  # quant.TYPES: 4-bit signed codes are stored as q - lo
    if t.affine:
        d, m, q = _search_affine(xb, w, hi)
        blocks = [_f16_bytes(d), _f16_bytes(m), _pack_nibbles(q)]
    else:
        d, q = _search_symmetric(xb, w, lo, hi)
        blocks = [_f16_bytes(d), pack_codes(t, q)]
    return np.ascontiguousarray(np.concatenate(blocks, axis=-1).reshape(rows, -1))


def pack_codes(t: quant.QuantType, q: np.ndarray) -> np.ndarray:
    """Integer codes [n, B] of a symmetric type -> its code bytes: int8 as they are (8-bit),
    nibbles of q - lowest code (4-bit)."""
    if t.bits == 8:
        return q.astype(np.int8).view(np.uint8)
    return _pack_nibbles((q - t.codes[0]).astype(np.uint8))


def importance(x: np.ndarray, block_size: int, col_weights: np.ndarray | None = None,
               name: str = "tensor") -> np.ndarray:
    """float32 [rows * cols / B, B]: the weight of each element's squared error, c_j."""
    x = np.asarray(x)
    rows, cols = x.shape
    if col_weights is None:
        return np.ones((rows * cols // block_size, block_size), np.float32)
    c = np.asarray(col_weights, dtype=np.float32).reshape(-1)
    if c.shape != (cols,) or not np.isfinite(c).all() or (c < 0).any():
        raise QuantizationError(f"tensor {name}: column weights must be {cols} finite "
                                "values >= 0")
    # a column never active in calibration still gets a little weight
    c = np.maximum(c, np.float32(1e-6) * max(float(c.mean()), 1e-30))
    return np.ascontiguousarray(np.broadcast_to(c, (rows, cols))).reshape(-1, block_size)


def weighted_error(x: np.ndarray, data: np.ndarray, type_name: str,
                   block_size: int = quant.DEFAULT_BLOCK,
                   col_weights: np.ndarray | None = None) -> float:
    """sum_ij c_j (x_ij - dequantized_ij)^2: with calibration weights c, the expected squared
    error one token adds to the layer's output."""
    x = np.asarray(x, dtype=np.float32)
    err = np.square(quant.dequantize(data, type_name, x.shape, block_size) - x)
    if col_weights is not None:
        err *= np.asarray(col_weights, dtype=np.float32)
    return float(err.sum(dtype=np.float64))


# --- the searches: x, w float32 [N, B] ---------------------------------------------------

def _f16(v: np.ndarray) -> np.ndarray:
    """float32 values as the f16 the block stores (inf where f16 overflows)."""
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1) / d
    return np.where(np.isfinite(inv), inv, np.float32(0)).astype(np.float32)


def _codes(x: np.ndarray, inv: np.ndarray, lo: int, hi: int, m: np.ndarray | None = None
           ) -> np.ndarray:
    """Nearest codes clip(rint((x - m) * inv)) as float32 [N, B]."""
    t = (x - m[:, None]) if m is not None else x.copy()
    t *= inv[:, None]
    np.rint(t, out=t)
    return np.clip(t, lo, hi, out=t)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b, dtype=np.float32)


def _err(x: np.ndarray, w: np.ndarray, q: np.ndarray, d: np.ndarray,
         m: np.ndarray | None = None) -> np.ndarray:
    """Weighted squared error per block of the values d * q (+ m)."""
    r = q * d[:, None]
    if m is not None:
        r += m[:, None]
    r -= x
    return _dot(w * r, r)


def _fit_symmetric(x: np.ndarray, w: np.ndarray, q: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(d, score): d = argmin sum w (x - d q)^2; score = (sum wxq)^2 / sum wq^2, the error
    reduction (larger is better)."""
    wq = w * q
    sxq, sqq = _dot(wq, x), _dot(wq, q)
    ok = sqq > 0
    safe = np.where(ok, sqq, 1)
    return np.where(ok, sxq / safe, 0).astype(np.float32), \
        np.where(ok, sxq * sxq / safe, 0).astype(np.float32)


def _search_symmetric(x: np.ndarray, w: np.ndarray, lo: int, hi: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(f16-exact d [N], codes [N, B] in lo..hi) for values d * q."""
    idx = np.abs(x).argmax(axis=1)
    vmax = np.take_along_axis(x, idx[:, None], axis=1)[:, 0]
    inv_vmax = _inverse(vmax)
    # Candidates map the signed max to code k: near lo (or hi), a little past it (clipping
    # it), or well inside (a finer grid for the other elements).
    span = np.linspace(SPAN[0], SPAN[1], SPAN[2], dtype=np.float32)
    ks = span * hi if lo == -hi else np.concatenate([span * lo, span[span <= 1] * hi])
    best_d, best = np.zeros_like(vmax), np.full(vmax.shape, -1, np.float32)
    for k in ks:
        d, score = _fit_symmetric(x, w, _codes(x, k * inv_vmax, lo, hi))
        better = score > best
        best_d, best = np.where(better, d, best_d), np.where(better, score, best)
    d = best_d
    for _ in range(REFINE_ROUNDS):
        d, _ = _fit_symmetric(x, w, _codes(x, _inverse(_f16(d)), lo, hi))
    d = _f16(d)
    d = np.where(np.isfinite(d), d, 0).astype(np.float32)
    q = _codes(x, _inverse(d), lo, hi)
    # The reference scale (q8_0: max-abs / 127; q4_0: signed max / -8), stored as f16 with
    # the nearest codes for it: kept where it is at least as good.
    rd = _f16(np.abs(vmax) / np.float32(hi) if lo == -hi else vmax / np.float32(lo))
    rq = _codes(x, _inverse(rd), lo, hi)
    use_ref = _err(x, w, rq, rd) <= _err(x, w, q, d)
    d = np.where(use_ref, rd, d)
    q = np.where(use_ref[:, None], rq, q)
    return d.astype(np.float32), q.astype(np.int32)


def _fit_affine(x: np.ndarray, w: np.ndarray, q: np.ndarray, sw: np.ndarray,
                sx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, m) = argmin sum w (x - d q - m)^2 for fixed codes q."""
    wq = w * q
    sq, sqq, sxq = wq.sum(axis=1), _dot(wq, q), _dot(wq, x)
    det = sw * sqq - sq * sq
    ok = det > 1e-12 * np.maximum(sw * sqq, 1e-30)
    safe = np.where(ok, det, 1)
    d = np.where(ok, (sw * sxq - sq * sx) / safe, 0)
    m = np.where(ok, (sqq * sx - sq * sxq) / safe, sx / sw)
    return d.astype(np.float32), m.astype(np.float32)


def _search_affine(x: np.ndarray, w: np.ndarray, nmax: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(f16-exact d [N], f16-exact m [N], codes [N, B] in 0..nmax) for values d * q + m."""
    mn, mx = x.min(axis=1), x.max(axis=1)
    inv_range = _inverse(mx - mn)
    sw, sx = w.sum(axis=1), _dot(w, x)
    best_d, best_m = np.zeros_like(mn), mn.copy()
    best = np.full(mn.shape, np.inf, np.float32)
    for t in np.linspace(nmax - 2.5, nmax + 1.5, 17, dtype=np.float32):
        q = _codes(x, t * inv_range, 0, nmax, mn)
        d, m = _fit_affine(x, w, q, sw, sx)
        e = _err(x, w, q, d, m)
        better = e < best
        best_d, best_m = np.where(better, d, best_d), np.where(better, m, best_m)
        best = np.where(better, e, best)
    d, m = best_d, best_m
    for _ in range(REFINE_ROUNDS):
        q = _codes(x, _inverse(_f16(d)), 0, nmax, _f16(m))
        d, m = _fit_affine(x, w, q, sw, sx)
    d, m = _f16(d), _f16(m)
    bad = ~(np.isfinite(d) & np.isfinite(m))
    d, m = np.where(bad, 0, d).astype(np.float32), np.where(bad, _f16(mn), m).astype(np.float32)
    q = _codes(x, _inverse(d), 0, nmax, m)
    # The reference (min, (max - min) / nmax), stored as f16: keep it where it is as good.
    rd, rm = _f16((mx - mn) / np.float32(nmax)), _f16(mn)
    rq = _codes(x, _inverse(rd), 0, nmax, rm)
    use_ref = _err(x, w, rq, rd, rm) <= _err(x, w, q, d, m)
    d, m = np.where(use_ref, rd, d), np.where(use_ref, rm, m)
    q = np.where(use_ref[:, None], rq, q)
    return d.astype(np.float32), m.astype(np.float32), q.astype(np.int32)


# --- block bytes (edgellm.modelfile.quant's layout) -----------------------------------------------

def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 [N] -> uint8 [N, 2] (little-endian f16)."""
    return v.astype("<f2").view(np.uint8).reshape(-1, 2)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """codes [N, B] in 0..15 -> uint8 [N, B/2]: element j low nibble, j + B/2 high."""
    q = q.astype(np.uint8)
    half = q.shape[-1] // 2
    return (q[:, :half] | (q[:, half:] << 4)).astype(np.uint8)
