"""Matrix-vector kernels (decode, T == 1): out[0, N] = W[N, K] @ x[0, K].

W is the stored weight: uint8 [N, row_bytes] of ggml blocks for q8_0/q4_0/q4_1 (block size
`block`: 32, 64 or 128), float32 [N, K] for f32, the uint16 bits of float16 [N, K] for f16
(`block` unused). Activations and `out` are 2-D [>= 1, .] and only row 0 is used, so an
ActQ8 buffer of any T_max serves.

Each type's kernels are made by `make_matvec(code)` from its tiles (tiles.py), found by
its code (registry.py: KERNELS[code][role]); they share their leading arguments:
  mv_rows / mvp_rows(..., r0, r1)   serial, output rows r0..r1-1 only: call it directly on
                              one thread, or from a fused kernel that splits rows by hand
                              (define that one with jit.kernel: see jit.py, caching)
  mv / mvp(...)               parallel: chunks of CHUNK rows, an equal run per thread
mv_*  int8 activations (xq, xd, xds from act_quant): row groups (the tile "g": q4_0 / q4_1
      GROUP rows per tile, the per-block float work done once for the group, the next group
      prefetched: the rows side by side are not one stream the hardware prefetches;
      q8_0 four rows at a time, the activation side shared, one xor per row and block
      instead of the sign trick, the next rows prefetched: 8-row groups with their
      per-block reduction measured slower); the last rows one at a time.
mvp_* float32 activations, each weight block dequantized in registers ("precise");
      the only mode of f32/f16 weights
embed(w, block, ids, out): out[t] = dequantized row ids[t] (embedding lookup)
mvb_rows / mvb(..., T)  int8, out[:T] for T rows that are separate decode steps (a beam
      search's beams): each row group meets four, two, then one row a tile ("g4", "g2",
      "g": the batched step's tiles), so its weights come from memory once for all T, and
      each row's sums are added as mv adds them alone (bit for bit at block size 32; the
      last N % group rows through the one-row tile per row, as mv_rows). For types with
      "g4" tiles (the int8-code families: q8_0, q4_0, q4_1, iq4_nl)
Callers validate shapes and ids first (linear.py): these kernels do not check bounds.
"""

from numba import prange

from .family import TILES, kern, name_of, tile
from .jit import kernel
from .tiles import RECIPES

CHUNK = 16  # rows per parallel work item


def named(name: str):
    """A decorator: the function under the name compile notices and cache files show
    (mv_rows_q4_1), put on before @kernel reads it."""
    def rename(f):
        f.__name__ = f.__qualname__ = name
        return f
    return rename


def parallel_rows(code: int, role: str, size: int, name: str):
    """A parallel kernel (w, block, x, out) over all rows of w: chunks of `size` rows, each
    through type code's float-activation rows kernel `role` (w, block, x, out, r0, r1)."""
    @kernel(parallel=True)
    @named(name)
    def run(w, block, x, out):
        n = w.shape[0]
        for c in prange((n + size - 1) // size):
            kern(code, role, w, block, x, out, c * size, min(n, c * size + size))
    return run


def make_matvec(code: int) -> dict:
    """Type `code`'s matrix-vector kernels: {"mv_rows", "mv" (int8 types), "mvp_rows",
    "mvp", "embed" (types with float tiles)}, each a kernel closing over the code alone
    (family.py: caching)."""
    name = name_of(code)
    R = RECIPES[name].group

    @kernel
    @named(f"mv_rows_{name}")
    def mv_rows(w, block, xq, xd, xds, out, r0, r1):
        """out[0, r0:r1] = W[r0:r1] @ x: row groups of R, then one row at a time."""
        i = r0
        while i + R <= r1:
            tile(code, "g", w, block, i, xq, xd, xds, 0, out)
            i += R
        for j in range(i, r1):
            tile(code, "1", w, block, j, xq, xd, xds, 0, out)

    @kernel(parallel=True)
    @named(f"mv_{name}")
    def mv(w, block, xq, xd, xds, out):
        n = w.shape[0]
        for c in prange((n + CHUNK - 1) // CHUNK):
            kern(code, "mv_rows", w, block, xq, xd, xds, out, c * CHUNK,
                 min(n, c * CHUNK + CHUNK))

    @kernel
    @named(f"mvp_rows_{name}")
    def mvp_rows(w, block, x, out, r0, r1):
        """out[0, r0:r1] = W[r0:r1] @ x[0], weights dequantized in registers."""
        for i in range(r0, r1):
            tile(code, "f1", w, block, i, x, 0, out)

    mvp = parallel_rows(code, "mvp_rows", CHUNK, f"mvp_{name}")

    @kernel
    @named(f"embed_{name}")
    def embed(w, block, ids, out):
        for t in range(ids.shape[0]):
            tile(code, "row", w, block, ids[t], out, t)

    @kernel
    @named(f"mvb_rows_{name}")
    def mvb_rows(w, block, xq, xd, xds, out, r0, r1, T):
        """out[:T, r0:r1] = x[:T] @ W[r0:r1].T, each row as mv_rows computes it alone."""
        i = r0
        while i + R <= r1:
            t = 0
            while t + 4 <= T:
                tile(code, "g4", w, block, i, xq, xd, xds, t, out)
                t += 4
            if t + 2 <= T:
                tile(code, "g2", w, block, i, xq, xd, xds, t, out)
                t += 2
            if t < T:
                tile(code, "g", w, block, i, xq, xd, xds, t, out)
            i += R
        for j in range(i, r1):
            for t in range(T):
                tile(code, "1", w, block, j, xq, xd, xds, t, out)

    @kernel(parallel=True)
    @named(f"mvb_{name}")
    def mvb(w, block, xq, xd, xds, out, T):
        n = w.shape[0]
        for c in prange((n + CHUNK - 1) // CHUNK):
            kern(code, "mvb_rows", w, block, xq, xd, xds, out, c * CHUNK,
                 min(n, c * CHUNK + CHUNK), T)

    recipe = RECIPES[name]
    kernels = dict(mvp_rows=mvp_rows, mvp=mvp, embed=embed) if recipe.floats else {}
    if R:
        kernels.update(mv_rows=mv_rows, mv=mv)
    if R and "g4" in TILES[code]:
        kernels.update(mvb_rows=mvb_rows, mvb=mvb)
    return kernels
