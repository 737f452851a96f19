"""Matrix-vector kernels (decode, T == 1): out[0, N] = W[N, K] @ x[0, K].

W is the stored weight: uint8 [N, row_bytes] of ggml blocks for q8_0/q4_0/q4_1 (block size
`block`: 32, 64 or 128), float32 [N, K] for f32, the uint16 bits of float16 [N, K] for f16
(`block` unused). Activations and `out` are 2-D [>= 1, .] and only row 0 is used, so an
ActQ8 buffer of any T_max serves.

Per weight type and mode, two entry points with the same leading arguments:
  *_rows_<type>(..., r0, r1)  serial, output rows r0..r1-1 only: call it directly on one
                              thread, or from a fused kernel that splits rows by hand
                              (define that one with jit.kernel: see jit.py, caching)
  <prefix>_<type>(...)        parallel: chunks of CHUNK rows, an equal run per thread
mv_*  int8 activations (xq, xd, xds from act_quant). q4_0 / q4_1: row groups (codegen_int8's
      GROUP rows per tile, the per-block float work done once for the group, the next
      group prefetched: the rows side by side are not one stream the hardware prefetches);
      the last rows one at a time. q8_0: four rows at a time (codegen_int8's
      _q8act_row_codegen: the activation side shared, one xor per row and block instead of
      the sign trick, the next rows prefetched), the last ones alone; 8-row groups with
      their per-block reduction had measured 10% slower here.
mvp_* float32 activations, each weight block dequantized in registers ("precise");
      the only mode of f32/f16 weights
embed_<type>(w, block, ids, out): out[t] = dequantized row ids[t] (embedding lookup)
Callers validate shapes and ids first (linear.py): these kernels do not check bounds.
"""

from numba import prange

from .codegen_int8 import GROUP
from .jit import kernel
from .tiles import (  # noqa: F401  (intrinsics, resolved by numba at compile time)
    ftile_f16_1x1,
    ftile_f32_1x1,
    ftile_q4_0_1x1,
    ftile_q4_1_1x1,
    ftile_q8_0_1x1,
    row_f16,
    row_f32,
    row_q4_0,
    row_q4_1,
    row_q8_0,
    tile_q4_0_1x1,
    tile_q4_0_8x1,
    tile_q4_1_1x1,
    tile_q4_1_8x1,
    tile_q8_0_1x1,
    tile_q8_0_4x1,
)

CHUNK = 16  # rows per parallel work item


# --- int8 activations -------------------------------------------------------------------

@kernel
def mv_rows_q8_0(w, block, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x, q8_0 weights (four rows at a time: see the docstring)."""
    i = r0
    while i + 4 <= r1:
        tile_q8_0_4x1(w, block, i, xq, xd, xds, 0, out)
        i += 4
    for j in range(i, r1):
        tile_q8_0_1x1(w, block, j, xq, xd, xds, 0, out)


@kernel
def mv_rows_q4_0(w, block, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x, q4_0 weights."""
    i = r0
    while i + GROUP <= r1:
        tile_q4_0_8x1(w, block, i, xq, xd, xds, 0, out)
        i += GROUP
    for j in range(i, r1):
        tile_q4_0_1x1(w, block, j, xq, xd, xds, 0, out)


@kernel
def mv_rows_q4_1(w, block, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x, q4_1 weights."""
    i = r0
    while i + GROUP <= r1:
        tile_q4_1_8x1(w, block, i, xq, xd, xds, 0, out)
        i += GROUP
    for j in range(i, r1):
        tile_q4_1_1x1(w, block, j, xq, xd, xds, 0, out)


@kernel(parallel=True)
def mv_q8_0(w, block, xq, xd, xds, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_q8_0(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel(parallel=True)
def mv_q4_0(w, block, xq, xd, xds, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_q4_0(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel(parallel=True)
def mv_q4_1(w, block, xq, xd, xds, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mv_rows_q4_1(w, block, xq, xd, xds, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


# --- float activations ------------------------------------------------------------------

@kernel
def mvp_rows_q8_0(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], q8_0 weights dequantized in registers."""
    for i in range(r0, r1):
        ftile_q8_0_1x1(w, block, i, x, 0, out)


@kernel
def mvp_rows_q4_0(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], q4_0 weights dequantized in registers."""
    for i in range(r0, r1):
        ftile_q4_0_1x1(w, block, i, x, 0, out)


@kernel
def mvp_rows_q4_1(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], q4_1 weights dequantized in registers."""
    for i in range(r0, r1):
        ftile_q4_1_1x1(w, block, i, x, 0, out)


@kernel
def mvp_rows_f32(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], float32 W [N, K], any K."""
    for i in range(r0, r1):
        ftile_f32_1x1(w, block, i, x, 0, out)


@kernel
def mvp_rows_f16(w, block, x, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0], W the uint16 bits of float16 [N, K], any K."""
    for i in range(r0, r1):
        ftile_f16_1x1(w, block, i, x, 0, out)


@kernel(parallel=True)
def mvp_q8_0(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_q8_0(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel(parallel=True)
def mvp_q4_0(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_q4_0(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel(parallel=True)
def mvp_q4_1(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_q4_1(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel(parallel=True)
def mvp_f32(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_f32(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


@kernel(parallel=True)
def mvp_f16(w, block, x, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        mvp_rows_f16(w, block, x, out, c * CHUNK, min(n, c * CHUNK + CHUNK))


# --- embedding --------------------------------------------------------------------------

@kernel
def embed_q8_0(w, block, ids, out):
    for t in range(ids.shape[0]):
        row_q8_0(w, block, ids[t], out, t)


@kernel
def embed_q4_0(w, block, ids, out):
    for t in range(ids.shape[0]):
        row_q4_0(w, block, ids[t], out, t)


@kernel
def embed_q4_1(w, block, ids, out):
    for t in range(ids.shape[0]):
        row_q4_1(w, block, ids[t], out, t)


@kernel
def embed_f32(w, block, ids, out):
    for t in range(ids.shape[0]):
        row_f32(w, block, ids[t], out, t)


@kernel
def embed_f16(w, block, ids, out):
    for t in range(ids.shape[0]):
        row_f16(w, block, ids[t], out, t)
