"""Float GEMM over dequantized weight panels (the encoders' prefill):
out[T, N] = x[T, K] @ W[N, K].T for every stored type, with float activations.

Each group of 16 weight rows is dequantized once (the type's embedding kernel, matvec.py)
and transposed into a panel P [K, 16]; then every token meets it as an outer product: for
each k, broadcast x[t, k] and multiply-add the two <8 x f32> halves of P[k] into RT x 2
accumulators held in registers (an RT x 16 output tile, written once). This is the
register-blocked form BLAS kernels use; the row-dot tiles of matmul.py (x . W[n] with a
horizontal sum per output) reach about half its rate on AVX2. The k loop runs in steps of
16 (a cache line of each token's row of x), hinting each row PF_FLOATS ahead: the
hardware prefetcher follows the RT rows badly. Threads take groups of 16 rows. Rows past
the last whole group (N % 16) are plain dot products.

    make_gemm(code)(w, block, x, out)  w as linear.py validates it; x, out float32, C order
Callers validate shapes (kernels/linear.py's checks; arch/bert.py's _linear): these kernels
do not check bounds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..codegen.ir import _prefetch
from .family import kern, name_of
from .jit import kernel
from .matvec import named

W = 16  # panel width: output features per group (two <8 x f32> vectors)
RT = 6  # tokens per register tile (12 accumulators)
PF_FLOATS = 128  # how far ahead in each token's row of x the tile prefetches

_F = ir.FloatType()
_V8 = ir.VectorType(_F, 8)
_I64 = ir.IntType(64)


def _tile_codegen(rt: int):
    def codegen(ctx, b, sig, args):
        panel, x, out = (ctx.make_array(sig.args[k])(ctx, b, args[k]) for k in (0, 1, 3))
        t, n0 = args[2], args[4]
        K = cgutils.unpack_tuple(b, panel.shape)[0]
        xcols = cgutils.unpack_tuple(b, x.shape)[1]
        ocols = cgutils.unpack_tuple(b, out.shape)[1]
        fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(_V8, [_V8] * 3),
                                             "llvm.fma.v8f32")
        accs = [cgutils.alloca_once_value(b, ir.Constant(_V8, [0.0] * 8)) for _ in range(2 * rt)]
        xrows = [b.gep(x.data, [b.mul(b.add(t, ir.Constant(_I64, s)), xcols)])
                 for s in range(rt)]

        def step(k):  # one k: the panel row's two halves times each token's x[t + s, k]
            prow = b.gep(panel.data, [b.mul(k, ir.Constant(_I64, W))])
            halves = [b.load(b.bitcast(b.gep(prow, [ir.Constant(_I64, 8 * h)]),
                                       _V8.as_pointer()), align=4) for h in range(2)]
            for s in range(rt):
                xv = b.load(b.gep(xrows[s], [k]))
                splat = b.shuffle_vector(b.insert_element(ir.Constant(_V8, ir.Undefined), xv,
                                                          ir.Constant(ir.IntType(32), 0)),
                                         ir.Constant(_V8, ir.Undefined),
                                         ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8))
                for h in range(2):
                    a = accs[2 * s + h]
                    b.store(b.call(fma, [splat, halves[h], b.load(a)]), a)

        # k in steps of 16 (one cache line of each x row), each token's row hinted
        # PF_FLOATS ahead (past the row's end too: a hint never faults), then the K % 16 left
        sixteen = ir.Constant(_I64, 16)
        n16 = b.udiv(K, sixteen)
        with cgutils.for_range(b, n16) as loop:
            k0 = b.mul(loop.index, sixteen)
            for s in range(rt):
                _prefetch(b, b.gep(xrows[s], [b.add(k0, ir.Constant(_I64, PF_FLOATS))]))
            for u in range(16):
                step(b.add(k0, ir.Constant(_I64, u)))
        k_tail = b.mul(n16, sixteen)
        with cgutils.for_range(b, b.sub(K, k_tail)) as loop:
            step(b.add(k_tail, loop.index))
        for s in range(rt):
            orow = b.gep(out.data, [b.add(b.mul(b.add(t, ir.Constant(_I64, s)), ocols), n0)])
            for h in range(2):
                p = b.bitcast(b.gep(orow, [ir.Constant(_I64, 8 * h)]), _V8.as_pointer())
                b.store(b.load(accs[2 * s + h]), p, align=4)
        return ctx.get_dummy_value()
    return codegen


def _make_tile(rt: int):
    @intrinsic
    def tile(typingctx, panel, x, t, out, n0):
        """out[t:t+rt, n0:n0+16] = x[t:t+rt] @ panel [K, 16]."""
        if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 2
                   and a.layout == "C" for a in (panel, x, out)):
            return None
        return types.void(panel, x, types.int64, out, types.int64), _tile_codegen(rt)
    return tile


tile_rt = _make_tile(RT)
tile_1 = _make_tile(1)
tile_2 = _make_tile(2)
tile_3 = _make_tile(3)
tile_4 = _make_tile(4)
tile_5 = _make_tile(5)


@kernel
def tiles(panel, x, t0, t1, out, n0):
    """out[t0:t1, n0:n0+16] = x[t0:t1] @ panel: RT-row tiles, then one tile of the last
    (t1 - t0) % RT rows (a one-row tile is latency-bound: 2 chains of FMAs against the
    RT-row tile's 12)."""
    for t in range(t0, t1 - RT + 1, RT):
        tile_rt(panel, x, t, out, n0)
    r = (t1 - t0) % RT
    t = t1 - r
    if r == 1:
        tile_1(panel, x, t, out, n0)
    elif r == 2:
        tile_2(panel, x, t, out, n0)
    elif r == 3:
        tile_3(panel, x, t, out, n0)
    elif r == 4:
        tile_4(panel, x, t, out, n0)
    elif r == 5:
        tile_5(panel, x, t, out, n0)


@kernel
def _group(panel, rows, x, out, n0):
    """Transpose the dequantized rows [16, K] into the panel [K, 16], then all tokens."""
    K = rows.shape[1]
    for k in range(K):
        for j in range(W):
            panel[k, j] = rows[j, k]
    tiles(panel, x, 0, x.shape[0], out, n0)


@kernel
def _tail(rows, x, out, n0):
    """out[:, n0:n0+len(rows)] = x @ rows.T (the rows past the last group)."""
    for t in range(x.shape[0]):
        for j in range(rows.shape[0]):
            s = np.float32(0.0)
            for k in range(x.shape[1]):
                s += x[t, k] * rows[j, k]
            out[t, n0 + j] = s


def make_gemm(code: int):
    """Type `code`'s gemm(w, block, x, out): the type's rows dequantized by its embedding
    kernel (its only difference from another type's)."""
    @kernel(parallel=True)
    @named(f"gemm_{name_of(code)}")
    def gemm(w, block, x, out):
        N, K = w.shape[0], x.shape[1]
        for g in prange((N + W - 1) // W):
            ids = np.arange(g * W, min(N, g * W + W))
            rows = np.empty((ids.shape[0], K), np.float32)
            kern(code, "embed", w, block, ids, rows)
            if ids.shape[0] == W:
                _group(np.empty((K, W), np.float32), rows, x, out, g * W)
            else:
                _tail(rows, x, out, g * W)
    return gemm
