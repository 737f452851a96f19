"""Matrix-vector kernels (decode, T == 1): out[0, N] = W[N, K] @ x[0, K].

Shapes: W is the stored weight (uint8 [N, row_bytes] of ggml blocks for q8_0/q4_0/q4_1,
float32 [N, K] for f32, the uint16 bits of float16 [N, K] for f16); activations and `out`
are 2-D [>= 1, .] and only row 0 is used, so an ActQ8 buffer of any T_max serves.

Two entry points per weight type and mode, same arguments:
  mv_rows_<type>(..., r0, r1)  serial, rows r0..r1-1 only: call it directly on one thread, or
                               from a fused per-token kernel that splits rows by hand.
  mv_<type>(...)               parallel over rows (one contiguous share per thread).
Modes: mv_* take int8 activations (xq, xd, xds from act_quant); mvp_* ("precise") take
float32 x and dequantize each weight block in registers; f32/f16 weights only have mvp_*.
`block` is the weight block size (32, 64 or 128). Callers validate shapes first
(linear.py): these kernels do not check bounds.
"""

from numba import prange

from .simd import (  # noqa: F401  (the intrinsics the kernels below call)
    ftile_f16_b0_1x1,
    ftile_f32_b0_1x1,
    ftile_q4_0_b32_1x1,
    ftile_q4_0_b64_1x1,
    ftile_q4_0_b128_1x1,
    ftile_q4_1_b32_1x1,
    ftile_q4_1_b64_1x1,
    ftile_q4_1_b128_1x1,
    ftile_q8_0_b32_1x1,
    ftile_q8_0_b64_1x1,
    ftile_q8_0_b128_1x1,
    kernel,
    row_f16_b0,
    row_f32_b0,
    row_q4_0_b32,
    row_q4_0_b64,
    row_q4_0_b128,
    row_q4_1_b32,
    row_q4_1_b64,
    row_q4_1_b128,
    row_q8_0_b32,
    row_q8_0_b64,
    row_q8_0_b128,
    tile_q4_0_b32_1x1,
    tile_q4_0_b32_2x1,
    tile_q4_0_b64_1x1,
    tile_q4_0_b128_1x1,
    tile_q4_1_b32_1x1,
    tile_q4_1_b32_2x1,
    tile_q4_1_b64_1x1,
    tile_q4_1_b128_1x1,
    tile_q8_0_b32_1x1,
    tile_q8_0_b32_2x1,
    tile_q8_0_b64_1x1,
    tile_q8_0_b128_1x1,
)

CHUNK = 16  # rows per parallel work item


@kernel
def mv_rows_q8_0(w, block, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x: q8_0 weights, int8 activations (row 0 of xq/xd/xds)."""
    if block == 32:
        i = r0
        while i + 1 < r1:
            tile_q8_0_b32_2x1(w, i, xq, xd, xds, 0, out)
            i += 2
        if i < r1:
            tile_q8_0_b32_1x1(w, i, xq, xd, xds, 0, out)
    elif block == 64:
        for i in range(r0, r1):
            tile_q8_0_b64_1x1(w, i, xq, xd, xds, 0, out)
    else:
        for i in range(r0, r1):
            tile_q8_0_b128_1x1(w, i, xq, xd, xds, 0, out)


@kernel(parallel=True)
def mv_q8_0(w, block, xq, xd, xds, out):
    """Parallel mv_rows_q8_0: chunks of CHUNK rows, an equal run of chunks per thread."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_q8_0(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mv_rows_q4_0(w, block, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x: q4_0 weights, int8 activations (row 0 of xq/xd/xds)."""
    if block == 32:
        i = r0
        while i + 1 < r1:
            tile_q4_0_b32_2x1(w, i, xq, xd, xds, 0, out)
            i += 2
        if i < r1:
            tile_q4_0_b32_1x1(w, i, xq, xd, xds, 0, out)
    elif block == 64:
        for i in range(r0, r1):
            tile_q4_0_b64_1x1(w, i, xq, xd, xds, 0, out)
    else:
        for i in range(r0, r1):
            tile_q4_0_b128_1x1(w, i, xq, xd, xds, 0, out)


@kernel(parallel=True)
def mv_q4_0(w, block, xq, xd, xds, out):
    """Parallel mv_rows_q4_0: chunks of CHUNK rows, an equal run of chunks per thread."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_q4_0(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mv_rows_q4_1(w, block, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x: q4_1 weights, int8 activations (row 0 of xq/xd/xds)."""
    if block == 32:
        i = r0
        while i + 1 < r1:
            tile_q4_1_b32_2x1(w, i, xq, xd, xds, 0, out)
            i += 2
        if i < r1:
            tile_q4_1_b32_1x1(w, i, xq, xd, xds, 0, out)
    elif block == 64:
        for i in range(r0, r1):
            tile_q4_1_b64_1x1(w, i, xq, xd, xds, 0, out)
    else:
        for i in range(r0, r1):
            tile_q4_1_b128_1x1(w, i, xq, xd, xds, 0, out)


@kernel(parallel=True)
def mv_q4_1(w, block, xq, xd, xds, out):
    """Parallel mv_rows_q4_1: chunks of CHUNK rows, an equal run of chunks per thread."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_q4_1(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mvp_rows_q8_0(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0]: q8_0 weights dequantized in registers, float x."""
    if block == 32:
        for i in range(r0, r1):
            ftile_q8_0_b32_1x1(w, i, x, 0, out)
    elif block == 64:
        for i in range(r0, r1):
            ftile_q8_0_b64_1x1(w, i, x, 0, out)
    else:
        for i in range(r0, r1):
            ftile_q8_0_b128_1x1(w, i, x, 0, out)


@kernel(parallel=True)
def mvp_q8_0(w, block, x, out):
    """Parallel mvp_rows_q8_0."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_q8_0(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mvp_rows_q4_0(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0]: q4_0 weights dequantized in registers, float x."""
    if block == 32:
        for i in range(r0, r1):
            ftile_q4_0_b32_1x1(w, i, x, 0, out)
    elif block == 64:
        for i in range(r0, r1):
            ftile_q4_0_b64_1x1(w, i, x, 0, out)
    else:
        for i in range(r0, r1):
            ftile_q4_0_b128_1x1(w, i, x, 0, out)


@kernel(parallel=True)
def mvp_q4_0(w, block, x, out):
    """Parallel mvp_rows_q4_0."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_q4_0(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mvp_rows_q4_1(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0]: q4_1 weights dequantized in registers, float x."""
    if block == 32:
        for i in range(r0, r1):
            ftile_q4_1_b32_1x1(w, i, x, 0, out)
    elif block == 64:
        for i in range(r0, r1):
            ftile_q4_1_b64_1x1(w, i, x, 0, out)
    else:
        for i in range(r0, r1):
            ftile_q4_1_b128_1x1(w, i, x, 0, out)


@kernel(parallel=True)
def mvp_q4_1(w, block, x, out):
    """Parallel mvp_rows_q4_1."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_q4_1(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mvp_rows_f32(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0]: W float32 [N, K], any K (`block` unused)."""
    for i in range(r0, r1):
        ftile_f32_b0_1x1(w, i, x, 0, out)


@kernel(parallel=True)
def mvp_f32(w, block, x, out):
    """Parallel mvp_rows_f32."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_f32(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))

@kernel
def mvp_rows_f16(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0]: W uint16: the f16 bits [N, K], any K (`block` unused)."""
    for i in range(r0, r1):
        ftile_f16_b0_1x1(w, i, x, 0, out)


@kernel(parallel=True)
def mvp_f16(w, block, x, out):
    """Parallel mvp_rows_f16."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_f16(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel
def embed_q8_0(w, block, ids, out):
    """out[t] = dequantized row ids[t] of q8_0 W [V, D] (ids validated by the caller)."""
    for t in range(ids.shape[0]):
        if block == 32:
            row_q8_0_b32(w, ids[t], out, t)
        elif block == 64:
            row_q8_0_b64(w, ids[t], out, t)
        else:
            row_q8_0_b128(w, ids[t], out, t)


@kernel
def embed_q4_0(w, block, ids, out):
    """out[t] = dequantized row ids[t] of q4_0 W [V, D] (ids validated by the caller)."""
    for t in range(ids.shape[0]):
        if block == 32:
            row_q4_0_b32(w, ids[t], out, t)
        elif block == 64:
            row_q4_0_b64(w, ids[t], out, t)
        else:
            row_q4_0_b128(w, ids[t], out, t)


@kernel
def embed_q4_1(w, block, ids, out):
    """out[t] = dequantized row ids[t] of q4_1 W [V, D] (ids validated by the caller)."""
    for t in range(ids.shape[0]):
        if block == 32:
            row_q4_1_b32(w, ids[t], out, t)
        elif block == 64:
            row_q4_1_b64(w, ids[t], out, t)
        else:
            row_q4_1_b128(w, ids[t], out, t)


@kernel
def embed_f32(w, block, ids, out):
    """out[t] = row ids[t] of f32 W [V, D] as float32 (`block` unused)."""
    for t in range(ids.shape[0]):
        row_f32_b0(w, ids[t], out, t)


@kernel
def embed_f16(w, block, ids, out):
    """out[t] = row ids[t] of f16 W [V, D] as float32 (`block` unused)."""
    for t in range(ids.shape[0]):
        row_f16_b0(w, ids[t], out, t)
