"""GPTQ: block quantization that compensates each column's rounding error in the columns
not yet quantized (Frantar et al., "GPTQ", 2022), on edgellm's block types.

For a linear layer y = W x with calibration inputs X [T, K], H = X^T X / T [K, K] is the
second moment of its inputs. The expected squared error of the output, for quantized
weights W^, is  sum_rows (w - w^) H (w - w^)^T.  Max-abs or searched rounding (quantizers.py)
minimizes only the diagonal part of that. GPTQ walks the columns in order, rounds column k,
and spreads its error over columns k+1.. in the way that minimizes the full quadratic form
(the update uses the Cholesky factor of H^-1), so later columns absorb earlier errors.

On edgellm's block types: the scale (and minimum) of each block of B columns is chosen
just before the block is rounded, by quantizers.py's search over the block's columns as
GPTQ has updated them, weighted by diag(H); then the block's codes are rounded column by
column with error feedback. The bytes are the types' usual blocks (the kernels read them).

H is damped (+1% of its mean diagonal) so that its inverse exists; columns no calibration
token reached (zero diagonal) are quantized without feedback.
"""

from __future__ import annotations

import numpy as np

from edgellm.errors import QuantizationError
from edgellm.modelfile import quant

from . import quantizers as qz

DAMP = 0.01


def gptq_quantize(x: np.ndarray, hessian: np.ndarray, type_name: str,
                  block_size: int = quant.DEFAULT_BLOCK, name: str = "tensor") -> np.ndarray:
    """Quantize x [rows, cols] to uint8 [rows, row_bytes] blocks of `type_name` (q8_0, q4_0,
    q4_1), minimizing the output error for inputs of second moment `hessian` [cols, cols]."""
    t = quant.qtype(type_name)
    x = np.asarray(x)
    if not t.quantized:
        return quant.quantize(x, type_name, block_size, name=name)
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise QuantizationError(f"tensor {name}: {bad} NaN or infinite values")
    quant.check_quantizable(name, x.shape, block_size)
    rows, cols = x.shape
    h = np.asarray(hessian, dtype=np.float64)
    if h.shape != (cols, cols) or not np.isfinite(h).all():
        raise QuantizationError(f"tensor {name}: the input second moment must be a finite "
                                f"{cols} x {cols} matrix, got {list(h.shape)}")
    u, diag = _inverse_factor(h)
    w = x.astype(np.float64).copy()
    dead = diag <= 0
    w[:, dead] = x[:, dead]  # no feedback into columns calibration never reached
    scales = np.zeros((rows, cols // block_size), np.float32)
    mins = np.zeros_like(scales) if t.affine else None
    codes = np.zeros((rows, cols), np.int32)
    for b in range(0, cols, block_size):
        e = slice(b, b + block_size)
        blk = w[:, e].astype(np.float32)
        cw = np.ascontiguousarray(np.broadcast_to(
            np.maximum(diag[e], 1e-12 * max(float(diag.mean()), 1e-30)).astype(np.float32),
            blk.shape))
        lo, hi = t.codes
        if t.affine:
            d, m, _ = qz._search_affine(blk, cw, hi)
        else:
            d, _ = qz._search_symmetric(blk, cw, lo, hi)
            m = np.zeros_like(d)
        inv = qz._inverse(d).astype(np.float64)
        d64, m64 = d.astype(np.float64), m.astype(np.float64)
        err = np.zeros((rows, block_size))
        for i in range(block_size):
            k = b + i
            col = w[:, k]
            q = np.clip(np.rint((col - m64) * inv), lo, hi)
            codes[:, k] = q
            err[:, i] = (col - (q * d64 + m64)) / u[k, k]
            w[:, k:b + block_size] -= np.outer(err[:, i], u[k, k:b + block_size])
        w[:, b + block_size:] -= err @ u[b:b + block_size, b + block_size:]
        scales[:, b // block_size] = d
        if mins is not None:
            mins[:, b // block_size] = m
    return _pack(t, scales, mins, codes, block_size)


def _inverse_factor(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(U upper triangular with H^-1 = U^T U for the damped H, diag(H) before damping)."""
    diag = np.diag(h).copy()
    h = h.copy()
    dead = diag <= 0
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = 1
    h[np.diag_indices_from(h)] += DAMP * max(float(np.mean(diag[~dead])) if (~dead).any()
                                             else 1.0, 1e-30)
    try:
        hinv = np.linalg.inv(h)
        u = np.linalg.cholesky(hinv).T
    except np.linalg.LinAlgError:  # numerically not positive definite: damp harder
        h[np.diag_indices_from(h)] += 0.1 * float(np.mean(np.diag(h)))
        u = np.linalg.cholesky(np.linalg.inv(h)).T
    u[dead, :] = 0
    u[dead, dead] = 1
    return u, diag


def _pack(t: quant.QuantType, scales: np.ndarray, mins: np.ndarray | None, codes: np.ndarray,
          block_size: int) -> np.ndarray:
    rows, cols = codes.shape
    q = codes.reshape(-1, block_size)
    d = scales.reshape(-1)
    if t.affine:
        parts = [qz._f16_bytes(d), qz._f16_bytes(mins.reshape(-1)), qz._pack_nibbles(q)]
    else:
        parts = [qz._f16_bytes(d), qz.pack_codes(t, q)]
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).reshape(rows, -1))
