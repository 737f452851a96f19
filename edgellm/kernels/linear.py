"""Linear layers and embeddings on stored weights: validation, then one kernel call.

    linear(w, x, out)            out[T, N] = x[T, K] @ W[N, K].T
    gemm(w, x, out)              the same on float activations over dequantized panels
                                 (panel_gemm.py: the encoders' prefill)
    embedding(w, ids, out)       out[T, D] = rows `ids` of W[V, D], dequantized

Weights are the zero-copy views `format.Tensor` hands out (read-only memmaps): uint8 ggml
blocks of a quant.TYPES block type with block size 32, 64 or 128, float32/float16 [N, K] for
f32/f16; a tensor whose `layout` is "x16" (modelfile/layout.py) runs x16.py's kernels
(q4_k, q6_k: x16_k.py's, on x quantized per super-block of 256: act_quant_k.ActK).
Which kernels run each type: registry.py.
They are never copied or dequantized as a whole.

Precision of quantized weights:
  act_dtype=int16  x is quantized to int16 blocks of 32 (ActQ8(dtype=np.int16)), the same
                 kernels on 16-bit lanes (vpmaddwd): ~1e-5 relative error, the models'
                 default (arch/base.py), which keeps the float model's greedy answers
  default        x is quantized to int8 blocks of 32 (ActQ8, llama.cpp's q8_0 activations)
                 and the kernels use integer dot products (VNNI where the CPU has it). Pass
                 an already filled `act` to share one quantization between layers reading
                 the same x (q/k/v, gate/up). Block sizes 64 and 128 run the same int8 path:
                 their scale multiplies 2 or 4 activation blocks.
  precise=True   x stays float32; each weight block is dequantized in registers.
f32/f16 weights always use float x (`act` is ignored for them).
T == 1 runs the matrix-vector kernels (decode), T > 1 the matrix-matrix ones (prefill);
decode=True with 1 < T <= DECODE_ROWS runs the matrix-vector row groups over all T rows at
once (matvec.py's mvb: a beam search's beams, each row's result the T == 1 kernel's for it
alone, the weights read once for all), where the type has them (registry.BATCH) at block
size 32; elsewhere the matrix-matrix kernels.
Threads: whatever numba.set_num_threads (or numba_setup.set_threads) last set.
"""

from __future__ import annotations

import threading
import weakref

import numba
import numpy as np

from ..modelfile import layout as layouts
from ..modelfile import quant
from ..runtime import numba_setup
from ..runtime.simd import VNNI
from . import act_quant, registry
from .act_buffers import Act, check_x
from .act_quant_k import ActK, quantize_k

try:  # for _threads(); numba.get_num_threads() is the fallback
    from numba.np.ufunc import parallel as _parallel
except ImportError:  # pragma: no cover
    _parallel = None

__all__ = ["ActQ8", "quantize_act", "linear", "gemm", "embedding"]

BLOCK_SIZES = quant.BLOCK_SIZES
_U8 = np.dtype(np.uint8)
PARALLEL_QUANT_T = 16  # quantize activations with a parallel kernel from this many rows
DECODE_ROWS = 8  # decode=True: up to this many rows (beams) on mvb, which beat the packed
# panels (mm) at 5 and 8 rows on whisper-base's q8_0 matrices; more rows go to the panels


class ActQ8(Act):
    """Preallocated integer activations for up to T_max rows of K features (K % 32 == 0).

    xq int8 (or int16: dtype=np.int16) [T_max, K]; per block of 32: xd float32 scale, xs
    int32 sum of the block's integers, xds float32 = xd * xs. `T` is the number of rows the
    last quantize_act filled.
    """

    __slots__ = ("xs", "xds")

    def __init__(self, T_max: int, K: int, dtype=np.int8):
        super().__init__(T_max, K, dtype)
        self.xs = np.zeros(self.xd.shape, np.int32)
        self.xds = np.zeros(self.xd.shape, np.float32)


def quantize_act(x: np.ndarray, act: ActQ8) -> ActQ8:
    """Quantize x float32 [T, K] into the first T rows of `act` (T <= act.T_max); returns act."""
    if not isinstance(act, ActQ8):
        raise ValueError(f"act must be an ActQ8, got {type(act).__name__}")
    T = act.rows_of(x)
    if T >= PARALLEL_QUANT_T and _threads() > 1:
        act_quant.quantize_rows_parallel(x, act.xq, act.xd, act.xs, act.xds, T)
    elif T:
        act_quant.quantize_rows(x, act.xq, act.xd, act.xs, act.xds, 0, T)
    act.T = T
    return act


_scratch = threading.local()


def _scratch_act(T: int, K: int, dtype, cls=ActQ8):
    """A per-thread ActQ8 (or ActK) for callers that pass no `act` (grows to the largest T
    seen)."""
    cache = _scratch.__dict__.setdefault(cls.__name__, {})
    key = (K, np.dtype(dtype))
    act = cache.get(key)
    if act is None or act.T_max < T:
        act = cache[key] = cls(max(T, 1), K, dtype)
    return act


_checked: dict[int, tuple] = {}  # id(tensor) -> (weakref to it, _weight's result)


def _weight(w):
    """Validate a weight Tensor; returns (type, N, K, block, data as the kernels take it).

    Tensors are frozen, so the result is remembered per tensor object (until it is freed):
    a decode step calls this ~200 times on the same weights.
    """
    hit = _checked.get(id(w))
    if hit is not None and hit[0]() is w:
        return hit[1]
    result = _check_weight(w)
    try:
        key = id(w)
        _checked[key] = (weakref.ref(w, lambda _, key=key: _checked.pop(key, None)), result)
    except TypeError:  # an object without weak references: just do not remember it
        pass
    return result


def _check_weight(w):
    try:
        kind, shape, block, data = w.type, w.shape, w.block_size, w.data
    except AttributeError:
        raise ValueError(f"w must be an edgellm Tensor (type, shape, block_size, data), "
                         f"got {type(w).__name__}") from None
    if len(shape) != 2:
        raise ValueError(f"tensor {w.name}: shape {list(shape)} is not 2-D [N, K]")
    N, K = shape
    if not isinstance(data, np.ndarray):
        raise ValueError(f"tensor {w.name}: data is {type(data).__name__}, not a numpy array")
    t = quant.TYPES.get(kind) if isinstance(kind, str) else None
    if t is None or not t.float_kernels:
        raise ValueError(f"tensor {w.name}: type {kind!r} has no kernel "
                         f"({', '.join(quant.MATRIX_TYPES)})")
    if t.quantized:
        if block not in t.blocks:
            raise ValueError(f"tensor {w.name}: {kind} block size {block} is not one of "
                             f"{t.blocks}")
        if K % block:
            raise ValueError(f"tensor {w.name}: {kind} K={K} does not split into blocks of "
                             f"{block}")
        layout = getattr(w, "layout", layouts.ROWS)
        if layout and not layouts.fits_x16(kind, (N, K), block):
            raise ValueError(f"tensor {w.name}: {kind} [{N}, {K}] blocks of {block} cannot be "
                             f"in layout {layout!r}")
        want = layouts.data_shape(kind, (N, K), block, layout)
        if data.dtype != _U8 or data.shape != want:
            raise ValueError(f"tensor {w.name}: {kind} data must be uint8 {list(want)}, got "
                             f"{data.dtype} {list(data.shape)}")
    else:
        if data.dtype != t.dtype or data.shape != (N, K):
            raise ValueError(f"tensor {w.name}: {kind} data must be {t.dtype} "
                             f"[{N}, {K}], got {data.dtype} {list(data.shape)}")
        if kind == "f16":
            data = data.view(np.uint16)  # numba has no float16: the kernels convert the bits
    if not data.flags.c_contiguous:
        raise ValueError(f"tensor {w.name}: data is not C-contiguous")
    if type(data) is not np.ndarray:  # np.memmap: numba types a plain ndarray faster
        data = data.view(np.ndarray)
    if data.flags.writeable:  # one compiled specialization: read-only, as memmapped weights
        data = data.view()
        data.flags.writeable = False
    return kind, N, K, block, data


def _threads() -> int:
    """numba.get_num_threads() without its locking once the pool runs (it is called per kernel call).

    The first call also warns if numba's threading layer is workqueue (numba_setup).
    """
    if _parallel is not None and getattr(_parallel, "_is_initialized", False):
        return _parallel._get_num_threads()
    n = numba.get_num_threads()  # starts the thread pool
    numba_setup.check_threading_layer()
    return n


def check_product(w, x: np.ndarray, out: np.ndarray) -> tuple:
    """ValueError unless out[T, N] = x[T, K] @ W[N, K].T can be computed as given (linear()
    and gemm); returns the weight's (kind, N, K, block, data)."""
    kind, N, K, block, data = _weight(w)
    check_x(x)
    check_x(out, "out")
    if x.shape[1] != K:
        raise ValueError(f"x {list(x.shape)} does not match weight {w.name} [N={N}, K={K}]")
    if out.shape != (x.shape[0], N):
        raise ValueError(f"out {list(out.shape)} must be [{x.shape[0]}, {N}] for x "
                         f"{list(x.shape)} and weight {w.name} [{N}, {K}]")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if np.may_share_memory(x, out):
        raise ValueError("out overlaps x")
    return kind, N, K, block, data


def linear(w, x: np.ndarray, out: np.ndarray, *, precise: bool = False,
           act: ActQ8 | None = None, act_dtype=np.int8, decode: bool = False) -> None:
    """out[T, N] = x[T, K] @ W[N, K].T for a stored weight `w` (see the module docstring).

    x and out are C-contiguous float32; `act`, if given, holds x already quantized
    (quantize_act) and is used instead of x on the integer path; without it x is quantized
    to act_dtype (int8 or int16) blocks. decode: x's rows are separate sequences' decode
    steps (see the module docstring). Raises ValueError on any
    shape, dtype or layout mismatch, before a kernel runs.
    """
    kind, N, K, block, data = check_product(w, x, out)
    T = x.shape[0]
    if T == 0:
        return
    if getattr(w, "layout", layouts.ROWS):
        _linear_x16(kind, data, x, out, precise, act, act_dtype)
        return
    if kind in registry.INT8 and not precise:
        if act is None:
            act = quantize_act(x, _scratch_act(T, K, act_dtype))
        elif not isinstance(act, ActQ8):
            raise ValueError(f"act must be an ActQ8, got {type(act).__name__}")
        elif act.K != K or act.T != T:
            raise ValueError(f"act holds {act.T} quantized rows of K={act.K}; x is "
                             f"{list(x.shape)} (call quantize_act(x, act) first)")
        rows, par, mm = registry.INT8[kind]
        if decode and 1 < T <= DECODE_ROWS and block == 32 and kind in registry.BATCH:
            if _threads() == 1:
                registry.BATCH[kind].rows(data, block, act.xq, act.xd, act.xds, out, 0, N, T)
            else:
                registry.BATCH[kind].parallel(data, block, act.xq, act.xd, act.xds, out, T)
        elif T > 1:
            mm(data, block, act.xq, act.xd, act.xs, act.xds, out, T, _threads())
        elif _threads() == 1:
            rows(data, block, act.xq, act.xd, act.xds, out, 0, N)
        else:
            par(data, block, act.xq, act.xd, act.xds, out)
        return
    k = registry.FLOAT[kind]
    rows, par, mm = k.rows, k.parallel, k.matmul
    if T > 1:
        mm(data, block, x, out)
    elif _threads() == 1:
        rows(data, block, x, out, 0, N)
    else:
        par(data, block, x, out)


def _act_for(x: np.ndarray, act: ActQ8 | None, act_dtype) -> ActQ8:
    """x quantized (into a scratch ActQ8), or `act` checked to hold x quantized."""
    T, K = x.shape
    if act is None:
        return quantize_act(x, _scratch_act(T, K, act_dtype))
    if not isinstance(act, ActQ8):
        raise ValueError(f"act must be an ActQ8, got {type(act).__name__}")
    if act.K != K or act.T != T:
        raise ValueError(f"act holds {act.T} quantized rows of K={act.K}; x is "
                         f"{list(x.shape)} (call quantize_act(x, act) first)")
    return act


def _linear_x16(kind, data, x, out, precise, act, act_dtype) -> None:
    """linear() of a matrix in the x16 layout (x16.py's kernels; q4_k, q6_k: x16_k.py's)."""
    k = registry.X16[kind]
    T = x.shape[0]
    if kind in layouts.X16_SB and not precise:
        dtype = np.dtype(act.xq.dtype if act is not None else act_dtype)
        if T > 1 and VNNI and dtype == np.int16:  # panel16's tiles, on ActQ8's blocks
            act = _act_for(x, act, act_dtype)
            k["mm_panels"](data, act.xq, act.xd, act.xds, out, T)
            return
        # its tiles read activations quantized per super-block, which an ActQ8 (blocks of
        # 32) is not: x quantized again, at the given act's integer type
        a = quantize_k(x, _scratch_act(T, x.shape[1], dtype, ActK), _threads())
        if T > 1:
            k["mm_sb"](data, a.xq, a.xd, a.xb, out, T)
        elif _threads() == 1:
            k["mv_rows_sb"](data, a.xq, a.xd, a.xb, out, 0, out.shape[1])
        else:
            k["mv_sb"](data, a.xq, a.xd, a.xb, out)
        return
    if precise:
        if T > 1:
            k["mmp"](data, x, out)
        elif _threads() == 1:
            k["mvp_rows"](data, x, out, 0, out.shape[1])
        else:
            k["mvp"](data, x, out)
        return
    act = _act_for(x, act, act_dtype)
    if T > 1:
        k["mm"](data, act.xq, act.xd, act.xs, act.xds, out, T)
    elif _threads() == 1:
        k["mv_rows"](data, act.xq, act.xd, act.xs, act.xds, out, 0, out.shape[1])
    else:
        k["mv"](data, act.xq, act.xd, act.xs, act.xds, out)


def gemm(w, x: np.ndarray, out: np.ndarray) -> None:
    """out[T, N] = x[T, K] @ W[N, K].T for a stored weight `w` (any type linear() runs),
    float activations; validated as linear() validates, then one kernel call."""
    kind, N, K, block, data = check_product(w, x, out)
    if x.shape[0] and getattr(w, "layout", layouts.ROWS):
        registry.X16[kind]["mmp"](data, x, out)
    elif x.shape[0]:
        registry.FLOAT[kind].gemm(data, block, x, out)


def embedding(w, ids: np.ndarray, out: np.ndarray) -> None:
    """out[T, D] = rows `ids` (integers in [0, V)) of the weight W[V, D], as float32."""
    kind, V, D, block, data = _weight(w)
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a 1-D integer array, got {ids.dtype} {ids.ndim}-D")
    check_x(out, "out")
    if out.shape != (ids.shape[0], D):
        raise ValueError(f"out {list(out.shape)} must be [{ids.shape[0]}, {D}]")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= V:
        raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {V})")
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if getattr(w, "layout", layouts.ROWS):
        registry.X16[kind]["embed"](data, ids, out)
    else:
        registry.FLOAT[kind].embed(data, block, ids, out)
