"""One decode step of any architecture in one parallel region: a program interpreter.

step/fused.py compiles an architecture's block (its list of steps, arch/steps.py) into a
program: one row of `prog` int64 [n_ops, WIDTH] per operation, with the barriers it needs
(ops.py: the op codes and their operands, read here by name). Python calls
`decode_parallel` (or `decode_serial`) once per generated token; inside, `nt` workers (one
per prange iteration) run the whole program. Each operation is one of

  NORM    private dst = rmsnorm(src) * (w + offset)         every worker, whole vector
  QUANT   private int8 copy of src in act slot s             every worker, whole vector
          (sb: super-blocks of 256, act_quant_k's ActK, for the K-quant matrices)
  PROJ    dst[r] = W[row0 + r] @ src (+ bias[r])             rows split between workers
          (sb: the slot holds super-blocks, read by kquant_kact's rows)
  ADD     dst[r] += src[r] (* c)                             rows split
  ACT     dst[r] = act(gate[r]) * up[r]  (silu | gelu_tanh)  rows split
  SCALE   buf[r] *= c;  SOFTCAP  buf[r] = c tanh(buf[r] / c) rows split
  ATTEND  q/k norm, RoPE, attention over the layer's cache plus this token (query heads
          split between workers, one KV group at a time), barrier, then the owner of each
          KV head's first query head stores its k, v in the cache
  LORA_A  t[R] = A @ src (a LoRA's down projection): private, every worker whole, or
          shared, its R rows split by heads (no alignment: R is small)
  LORA_B  dst[r] += B[row0 + r] . t (its up projection)      rows split (as its PROJ's)
  ROUTE   private top-k experts of router logits (kernels/moe.route)
  MOE     for each selected expert, ascending: gate/up rows, act | barrier | down rows,
          dst[r] += weight * y[r] | barrier  (only the selected experts' bytes are read)
  BARRIER all workers meet (sync.py)

Rows split with _split (boundaries on ALIGN): an op reading a vector on the same split that
wrote it needs no barrier; the compiler puts barriers where a whole vector is read after a
split write, or a vector is rewritten while others may still read it.

Vectors live in one float32 arena `mem`: addresses >= 0 are shared, -1 - a is offset a of
the calling worker's private part (mem[shared + tid * private + a]). Weights are read in
place from the mapped file (`blob`) at offsets from `mats` (MAT_* columns), in rows or, where
MAT_LAYOUT says x16 (modelfile/layout.py), 16 rows a group by x16.py's kernels; LoRA's A [R, K]
and B [N, R] as float16 bits from `lora` (half the bytes of f32: at rank 16 on every
projection they are a fifth of a 4-bit model's bytes per token). The kernels are
the per-operation path's own: rmsnorm, rmsnorm_heads, apply_rope, swiglu_row, geglu_tanh_row,
add_inplace, quantize_rows, the mv_rows_* / mvp_rows_* matrix-vector rows, route and
scatter_add; only attention has its decode form here (_attend_heads: it reads and writes
an f32, f16 or q8_0 cache through kv_store.kv_rows / store_kv_row, a few rows at a time).

Every offset, shape and type in the tables is checked by the caller (step/fused.py)
before the first call: these kernels do not check bounds.

The step compiles only what its model runs: `feats`, one entry per FEATURES (step/fused.py,
features()), says which kernels the program needs: its matrix types (KIND_FEATURES, one
entry per type code: feats[:N_KINDS] is the `kinds` tuple, indexed by code), the cache's
type (kv_*), MoE (ROUTE, MOE), LoRA (LORA_A, LORA_B) and x16 matrices, each None where the
program has none, else an array (any; a flat tuple: numba's parallel region does not take a
nested one holding None). `matvec_rows` dispatches a matrix by its code over the codes
`kinds` holds (family.by_kind: the chain of branches is made while numba types it), and the
functions below test the other entries as their own arguments (`if moe is not None`), which
numba's dead-branch pruning resolves before typing, so a model's step never types or
compiles the other kernels (a step with every entry set runs every program). The kernel
cache keeps one step per feature set.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.extending import overload

from ..kernels import registry  # noqa: F401  (fills KERNELS)
from ..kernels.act_quant import quantize_rows
from ..kernels.act_quant_k import quantize_rows_k
from ..kernels.activations import geglu_tanh_row, swiglu_row
from ..kernels.attn_tiles import row_max
from ..kernels.dots import LANES, dots16, prefetch_rows, wsum_rows
from ..kernels.family import KERNELS, by_kind, codes_of, kern
from ..kernels.fastexp import MASKED, exp_shift
from ..kernels.jit import GLUE, kernel
from ..kernels.kquant import mvp_rows_k
from ..kernels.kquant_int import has_kq, mv_rows_kq
from ..kernels.kquant_kact import KK_CODES, mv_rows_kk
from ..kernels.kv_store import kv_block, kv_rows, store_kv_row
from ..kernels.moe import route, scatter_add
from ..kernels.norms import add_inplace, rmsnorm, rmsnorm_heads
from ..kernels.rope import apply_rope
from ..kernels.sync import barrier
from ..modelfile import quant
from .ops import (
    ACT,
    ADD,
    ATTEND,
    BARRIER,
    LORA_A,
    LORA_B,
    MOE,
    NORM,
    PROJ,
    QUANT,
    ROUTE,
    SCALE,
    SILU,
    SOFTCAP,
    opcode,
    operands,
)

# Matrix kinds the step has kernels for: the quantized types (f32 only where a step asks
# for float activations: routers); each kind's code is its row's in the quant table
# (quant.TYPES[name].code). The types with a generated family run its rows
# (registry.KERNELS; q5_0 and q5_1 on float activations kquant.py's); the K-quants
# kquant.py's float-activation rows, but on integer activations q4_k, q5_k and q6_k run
# kquant_int.py's.
KINDS = tuple(n for n in quant.MATRIX_TYPES if quant.TYPES[n].quantized or n == "f32")
KIND_CODE = {name: quant.TYPES[name].code for name in KINDS}
F32, F16 = quant.TYPES["f32"].code, quant.TYPES["f16"].code
# mats[m] = (offset in the file, rows, row bytes, kind, block size, layout: 0 rows, 1 x16)
MAT_OFF, MAT_ROWS, MAT_ROW_BYTES, MAT_KIND, MAT_BLOCK, MAT_LAYOUT = range(6)
MAT_WIDTH = 6
LAYOUT_X16 = 1  # modelfile/layout.py's x16: rows r0..r1 (multiples of 16) at r0 * row bytes
# layers[l] = (first cache slot, slots, window, slot of this token, slots written)
LAYER_START, LAYER_CAP, LAYER_WINDOW, LAYER_SLOT, LAYER_FILLED = range(5)
LAYER_WIDTH = 5
# consts: model-wide floats the ops use; others are referenced by index
C_EPS, C_NORM_OFFSET = 0, 1
# ints: 0 (a row index scatter_add takes), the width of an int8 slot; then op tables
I_ZERO, I_KMAX = 0, 1

SLOTS = 2  # int8 activation slots per worker (xq rows tid * SLOTS ..)
ALIGN = 16  # row split granularity (cache-line friendly, whole prefill tiles)
NEG = MASKED  # the score of a slot a query does not see
# one per type code (the kinds tuple is indexed by code; a type the step does not run, f16,
# keeps its place)
KIND_FEATURES = tuple(sorted(quant.TYPES, key=lambda n: quant.TYPES[n].code))
assert [quant.TYPES[n].code for n in KIND_FEATURES] == list(range(len(KIND_FEATURES)))
N_KINDS = len(KIND_FEATURES)
KV_FEATURES = ("f32", "f16", "q8_0")
FEATURES = (*KIND_FEATURES, *("kv_" + k for k in KV_FEATURES), "moe", "lora", "x16")
KV_F32, KV_F16, KV_Q8_0, F_MOE, F_LORA, F_X16 = range(N_KINDS, len(FEATURES))  # their places


@kernel
def _split(n, tid, nt):
    """Rows [r0, r1) of n for worker tid of nt, boundaries on ALIGN."""
    per = (n + nt * ALIGN - 1) // (nt * ALIGN) * ALIGN
    r0 = min(n, tid * per)
    return r0, min(n, r0 + per)


@kernel
def _heads(n, tid, nt):
    """Heads [h0, h1) of n for worker tid (no alignment)."""
    per = (n + nt - 1) // nt
    h0 = min(n, tid * per)
    return h0, min(n, h0 + per)


@kernel
def _vec(mem, shared, private, tid, addr, n):
    """The float32 [n] vector at program address addr (see the module docstring)."""
    a = _addr(shared, private, tid, addr)
    return mem[a:a + n]


@kernel
def _addr(shared, private, tid, addr):
    """Program address addr's offset in mem: worker tid's private part for addr < 0."""
    return addr if addr >= 0 else shared + tid * private + (-1 - addr)


@kernel
def _row(mem, shared, private, tid, addr, n):
    """The same vector as a [1, n] row, as the per-operation kernels take it."""
    return _vec(mem, shared, private, tid, addr, n).reshape((1, n))


@kernel
def _act(xq, xd, xs, xds, ints, s, K):
    """Int8 activation slot s (of every worker's SLOTS) as [1, K] rows: xq, xd, xs, xds.
    The slots are flat arrays of ints[I_KMAX] values each (the widest input; xs: twice
    its blocks of 32, for _act_k's sums per 16): the kernels take a row's width from its
    array, so each view is exactly K wide."""
    kmax = ints[I_KMAX]
    q0, b0, nb = s * kmax, s * (kmax // 32), K // 32
    return (xq[q0:q0 + K].reshape((1, K)), xd[b0:b0 + nb].reshape((1, nb)),
            xs[2 * b0:2 * b0 + nb].reshape((1, nb)), xds[b0:b0 + nb].reshape((1, nb)))


@kernel
def _act_k(xq, xd, xs, ints, s, K):
    """Slot s as super-block activations (act_quant_k's ActK, K % 256 == 0): xq [1, K],
    xd [1, K/256] (in the slot's scales), xb [1, K/16] (its sums)."""
    kmax = ints[I_KMAX]
    q0, b0 = s * kmax, s * (kmax // 32)
    return (xq[q0:q0 + K].reshape((1, K)), xd[b0:b0 + K // 256].reshape((1, K // 256)),
            xs[2 * b0:2 * b0 + K // 16].reshape((1, K // 16)))


@kernel
def _k_rows(kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
    """The K-quants: kquant_int.py's rows on integer activations where the type has them,
    else kquant.py's on float ones (either: one compile for every code)."""
    if not float_acts and has_kq(kind):
        mv_rows_kq(kind, w, xq, xd, xds, out, r0, r1)
    else:
        mvp_rows_k(kind, w, h, out, r0, r1)


def _family_rows(c: int):
    """The rows of type c, which has a generated family (registry.KERNELS): its float rows
    kquant.py's where it has no float tiles (q5_0, q5_1). (Glue, not cached itself: it may
    hold the kernels.)"""
    k = KERNELS[c]
    mv, mvp = k.get("mv_rows"), k.get("mvp_rows")
    if c == F32:
        @njit(**GLUE)
        def rows(kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
            mvp(w.view(np.float32), block, h, out, r0, r1)
    elif mvp is None:
        @njit(**GLUE)
        def rows(kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
            if float_acts:
                mvp_rows_k(kind, w, h, out, r0, r1)
            else:
                mv(w, block, xq, xd, xds, out, r0, r1)
    else:
        @njit(**GLUE)
        def rows(kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
            if float_acts:
                mvp(w, block, h, out, r0, r1)
            else:
                mv(w, block, xq, xd, xds, out, r0, r1)
    return rows


# generated families (a K-quant's entry holds only its x16 kernels: x16_k.py)
_FAMILY = tuple(c for c in KIND_CODE.values()
                if any(not role.startswith("x16_") for role in KERNELS.get(c, {})))


def _k_case(c: int):
    """The rows of K-quant type c (_k_rows for that code alone: its kernels only)."""
    @njit(**GLUE)
    def rows(kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
        _k_rows(c, float_acts, w, block, h, xq, xd, xds, out, r0, r1)
    return rows


def matvec_rows(kinds, kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ h[0] for W of type code `kind`: the kernels of the codes
    `kinds` holds (see the module docstring)."""
    raise NotImplementedError("matvec_rows runs in kernels only")


@overload(matvec_rows, jit_options=GLUE)
def _matvec_rows(kinds, kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
    codes = [c for c in codes_of(kinds) if c in KIND_CODE.values()]
    chain = by_kind(codes, lambda c: _family_rows(c) if c in _FAMILY else _k_case(c))

    def impl(kinds, kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1):
        chain(kind, kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1)
    return impl


def _x16_case(c: int):
    """Type c's rows of an x16 matrix (x16.py): integer or float activations (a type
    whose x16 kernels take super-block activations, x16_k.py's, only float ones here: its
    integer rows are _mv_sb's)."""
    k = KERNELS[c]
    mv, mvp = k.get("x16_mv_rows"), k["x16_mvp_rows"]
    if mv is None:
        @njit(**GLUE)
        def rows_sb(float_acts, wi, h, xq, xd, xs, xds, out, r0, r1):
            if float_acts:
                mvp(wi, h, out, r0, r1)
        return rows_sb

    @njit(**GLUE)
    def rows(float_acts, wi, h, xq, xd, xs, xds, out, r0, r1):
        if float_acts:
            mvp(wi, h, out, r0, r1)
        else:
            mv(wi, xq, xd, xs, xds, out, r0, r1)
    return rows


@njit(**GLUE)
def _no_x16(float_acts, wi, h, xq, xd, xs, xds, out, r0, r1):
    pass


def x16_rows(kinds, kind, float_acts, wi, h, xq, xd, xs, xds, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ h[0] for W in the x16 layout (wi [rows / 16, 16 row
    bytes]), type code `kind` among the codes kinds holds; r0, r1 multiples of 16."""
    raise NotImplementedError("x16_rows runs in kernels only")


@overload(x16_rows, jit_options=GLUE)
def _x16_rows(kinds, kind, float_acts, wi, h, xq, xd, xs, xds, out, r0, r1):
    chain = by_kind([c for c in codes_of(kinds) if "x16_mvp_rows" in KERNELS.get(c, {})],
                    _x16_case, _no_x16)

    def impl(kinds, kind, float_acts, wi, h, xq, xd, xs, xds, out, r0, r1):
        chain(kind, float_acts, wi, h, xq, xd, xs, xds, out, r0, r1)
    return impl


@kernel
def _mv(blob, m, row0, rows, h, xq, xd, xs, xds, out, r0, r1, float_acts, kinds, x16):
    """out[0, r0:r1] = W[row0 + r0:row0 + r1] @ h[0] for matrix table entry m; kinds:
    feats' matrix types (indexed by code, None for a type the model has not); x16: feats'
    "x16" (None where no matrix is in the x16 layout: its kernels are not compiled)."""
    off, rb, kind, block = m[MAT_OFF] + row0 * m[MAT_ROW_BYTES], m[MAT_ROW_BYTES], m[MAT_KIND], \
        m[MAT_BLOCK]
    if m[MAT_LAYOUT] == LAYOUT_X16:
        if x16 is not None:  # row0, rows, r0, r1: multiples of 16 (step/fused.py)
            wi = blob[off:off + rows * rb].reshape((rows // 16, 16 * rb))
            x16_rows(kinds, kind, float_acts, wi, h, xq, xd, xs, xds, out, r0, r1)
    else:
        w = blob[off:off + rows * rb].reshape((rows, rb))
        matvec_rows(kinds, kind, float_acts, w, block, h, xq, xd, xds, out, r0, r1)


def sb_rows(kinds, kind, w, xq, xd, xb, out, r0, r1):
    """out[0, r0:r1] = W[r0:r1] @ x[0] on super-block activations (kquant_kact.py) for a
    K-quant code `kind`; compiled only where kinds holds one (else nothing)."""
    raise NotImplementedError("sb_rows runs in kernels only")


def _sb_chain(kinds, has, case):
    """sb_rows' and sb_x16_rows' impl: case(c) for the codes c kinds holds where has(c)."""
    codes = [c for c in codes_of(kinds) if has(c)]
    if not codes:
        return lambda kinds, kind, w, xq, xd, xb, out, r0, r1: None
    chain = by_kind(codes, case)

    def impl(kinds, kind, w, xq, xd, xb, out, r0, r1):
        chain(kind, w, xq, xd, xb, out, r0, r1)
    return impl


@overload(sb_rows, jit_options=GLUE)
def _sb_rows(kinds, kind, w, xq, xd, xb, out, r0, r1):
    return _sb_chain(kinds, lambda c: c in KK_CODES, _kk_case)


def _kk_case(c: int):
    """mv_rows_kk for K-quant type c alone."""
    @njit(**GLUE)
    def rows(w, xq, xd, xb, out, r0, r1):
        mv_rows_kk(c, w, xq, xd, xb, out, r0, r1)
    return rows


def sb_x16_rows(kinds, kind, w, xq, xd, xb, out, r0, r1):
    """sb_rows for a matrix in the x16 layout (x16_k.py: q4_k, q6_k); r0, r1 multiples of
    16."""
    raise NotImplementedError("sb_x16_rows runs in kernels only")


@overload(sb_x16_rows, jit_options=GLUE)
def _sb_x16_rows(kinds, kind, w, xq, xd, xb, out, r0, r1):
    return _sb_chain(kinds, lambda c: "x16_mv_rows_sb" in KERNELS.get(c, {}),
                     lambda c: KERNELS[c]["x16_mv_rows_sb"])


@kernel
def _mv_sb(blob, m, row0, rows, xq, xd, xb, out, r0, r1, kinds, x16):
    """_mv for a K-quant matrix on super-block activations (xq, xd, xb: _act_k's); x16 as
    _mv's."""
    off, rb = m[MAT_OFF] + row0 * m[MAT_ROW_BYTES], m[MAT_ROW_BYTES]
    if m[MAT_LAYOUT] == LAYOUT_X16:
        if x16 is not None:  # row0, rows, r0, r1: multiples of 16 (step/fused.py)
            wi = blob[off:off + rows * rb].reshape((rows // 16, 16 * rb))
            sb_x16_rows(kinds, m[MAT_KIND], wi, xq, xd, xb, out, r0, r1)
    else:
        w = blob[off:off + rows * rb].reshape((rows, rb))
        sb_rows(kinds, m[MAT_KIND], w, xq, xd, xb, out, r0, r1)


@kernel
def _proj_row(blob, m, o, h, xq, xd, xs, xds, ints, slot, out, r0, r1, precise, kinds, x16):
    """PROJ o's rows r0..r1-1 for one token: its slot as the op says (blocks of 32 or
    super-blocks), or float h where precise / float_acts."""
    if o.sb != 0 and not precise:
        aq, ad, ab = _act_k(xq, xd, xs, ints, slot, o.cols)
        _mv_sb(blob, m, o.row0, o.rows, aq, ad, ab, out, r0, r1, kinds, x16)
    else:
        aq, ad, asum, ads = _act(xq, xd, xs, xds, ints, slot, o.cols)
        _mv(blob, m, o.row0, o.rows, h, aq, ad, asum, ads, out, r0, r1,
            precise or o.float_acts != 0, kinds, x16)


@kernel
def _act_rows(kind, gate, up, out):
    """out = act(gate) * up over [1, n] rows (the per-operation path's kernels)."""
    if kind == SILU:
        swiglu_row(gate[0], up[0], out[0])
    else:
        geglu_tanh_row(gate[0], up[0], out[0])


@kernel
def _prep_head(src, perm, use_perm, dst, norm_w, use_norm, eps, offset, cos, sin):
    """dst [Dh] = rope(norm(src)), src read through perm where the layout asks for it."""
    Dh = dst.shape[0]
    if use_perm:
        for i in range(Dh):
            dst[i] = src[perm[i]]
    else:
        for i in range(Dh):
            dst[i] = src[i]
    x = dst.reshape((1, 1, Dh))
    if use_norm:
        rmsnorm_heads(x, norm_w, eps, offset)
    apply_rope(x, cos, sin)


@kernel
def _attend_group(qg, ng, kh, vh, kc, vc, cpos, kvh, p, window, scale, softcap, scores,
                  stats, out, hq0, tile):
    """Attention of query heads qg[:ng], the whole KV group kvh (heads hq0 = kvh * ng ..),
    over the cache slots (positions < p in the window) and this token (key kh, value vh
    [Dh]): _attend_heads on that one group (the batched step's unit)."""
    Dh = kh.shape[0]
    _attend_heads(qg, kh.reshape((1, Dh)), vh.reshape((1, Dh)), kvh, kc, vc, cpos, hq0,
                  hq0 + ng, ng, p, window, scale, softcap, scores, stats, out, tile)


@njit(**GLUE, inline="always")
def _cap_and_mask(scores, self_s, g0, g1, n, cpos, p, window, softcap):
    """Heads g0..g1-1 of a token at position p: its scores [g, :n] over the cache slots and
    self_s [g] (its own key's) capped (softcap > 0: softcap tanh(s / softcap)), then the
    slots it does not see (empty, not before p, or outside a sliding window > 0) set to NEG.
    The one-token step and a verify step's rows share it, inlined where numba types each
    (compiled as a function of its own, LLVM contracts its tanh differently in the two
    callers and a softcapped verify row no longer equals its decode step's bits)."""
    if softcap > 0:
        for g in range(g0, g1):
            self_s[g] = softcap * np.tanh(self_s[g] / softcap)
            for t in range(n):
                scores[g, t] = softcap * np.tanh(scores[g, t] / softcap)
    for t in range(n):
        kp = cpos[t]
        if not (kp >= 0 and kp < p and (window == 0 or p - kp < window)):
            for g in range(g0, g1):
                scores[g, t] = NEG


@kernel
def _attend_heads(qb, kb, vb, kvb, kc, vc, cpos, h0, h1, group, p, window, scale, softcap,
                  scores, stats, out, tile):
    """Attention of query heads h0..h1 (query rows qb[hq - h0], KV head hq // group) over
    the cache slots (positions < p in the window) and this token (key, value rows
    kb, vb [kvh - kvb] of [*, Dh]).

    The cache kc, vc [n, Hkv, width] is float32, or f16 / q8_0 rows (kv_types.py): dots16
    and wsum_rows read float32 and f16 rows in place (kv_block), q8_0 rows are decoded into
    tile [LANES, Dh] a few rows at a time (never the whole cache), as are the last n % 16
    keys of any type (kv_rows).
    Position-major: 16 cached positions at a time, every KV head's rows of them (a
    position's rows of all heads are contiguous: one pass over the cache, in order, where a
    head at a time strides across it a page a row); each head's arithmetic is the one-head
    loop's (dots16 per block of 16 keys, then its softmax, then wsum_rows per block of 16
    values, normalized at the end), so the result does not depend on which heads share a
    call. Scores soft-capped where softcap > 0. Scratch: scores [>= h1 - h0, >= slots],
    stats [1, >= h1 - h0]. out [Hq * Dh] receives heads h0..h1's rows.
    """
    n, Dh = kc.shape[0], kb.shape[1]
    kv0, kv1 = h0 // group, (h1 - 1) // group + 1
    self_s = stats[0]
    for hq in range(h0, h1):
        kr = kb[hq // group - kvb]
        acc = np.float32(0.0)
        for i in range(Dh):
            acc += qb[hq - h0, i] * kr[i]
        self_s[hq - h0] = acc * scale
    s = 0
    if Dh % LANES == 0:
        while s + LANES <= n:
            ahead = min(LANES, n - s - LANES)
            for kvh in range(kv0, kv1):
                keys = kc[:, kvh]  # [n, width], rows strided
                if ahead > 0:
                    prefetch_rows(keys, s + LANES, ahead)
                src, r = kv_block(keys, s, LANES, tile)
                for hq in range(max(h0, kvh * group), min(h1, (kvh + 1) * group)):
                    dots16(src, r, qb, hq - h0, scores, s, scale)
            s += LANES
    for t in range(s, n):
        for kvh in range(kv0, kv1):
            src, r = kv_rows(kc[:, kvh], t, 1, tile)
            kr = src[r]
            for hq in range(max(h0, kvh * group), min(h1, (kvh + 1) * group)):
                acc = np.float32(0.0)
                for i in range(Dh):
                    acc += qb[hq - h0, i] * kr[i]
                scores[hq - h0, t] = acc * scale
    nh = h1 - h0
    _cap_and_mask(scores, self_s, 0, nh, n, cpos, p, window, softcap)
    for g in range(nh):
        row = scores[g]
        best = max(self_s[g], row_max(scores, g, n))  # a vector max: the loop's is scalar
        e_self = np.exp(self_s[g] - best)  # one per head: libm
        exp_shift(row, n, best)
        total = e_self
        for t in range(n):
            total += row[t]
        self_s[g] = np.float32(1.0) / total  # applied at the end
        vr = vb[(h0 + g) // group - kvb]
        o = out[(h0 + g) * Dh:(h0 + g + 1) * Dh]
        for i in range(Dh):
            o[i] = e_self * vr[i]
    o2 = out.reshape((out.shape[0] // Dh, Dh))
    t = 0
    while t < n:  # LANES positions at a time, each head's value rows decoded once
        m = min(LANES, n - t)
        ahead = min(LANES, n - t - m)
        for kvh in range(kv0, kv1):
            vals = vc[:, kvh]
            if ahead > 0:
                prefetch_rows(vals, t + m, ahead)
            src, r = kv_block(vals, t, m, tile)
            for hq in range(max(h0, kvh * group), min(h1, (kvh + 1) * group)):
                wsum_rows(src, r, m, scores, hq - h0, t, o2, hq)
        t += m
    for g in range(nh):
        inv = self_s[g]
        o = out[(h0 + g) * Dh:(h0 + g + 1) * Dh]
        for i in range(Dh):
            o[i] *= inv


@kernel
def _attend_multi(qs, ks, mem, v_at, out_at, a, b, kc, vc, cpos, kvh, group, Hq, pos, fill,
                  window, scale, softcap, scores, stats, tile):
    """KV group kvh of rows a..b of one cache (a verify step's next positions): each row's
    query heads over its filled slots and its own key, as _attend_heads computes them for
    that row alone, bit for bit, but every block of 16 keys and values decoded and read once
    for all the rows (a row's attention reads the cache as a decode step does: sharing the
    reads is what makes a verify row cheaper than a step).

    Row j (of a..b): query heads qs[(j - a) * group + g] [Dh] (rotated), its key ks[j - a]
    (rotated), its value and output in its arena mem[j] at v_at, out_at (heads of Dh); its
    position pos[j], slots written fill[j] (kc, vc, cpos [cap, ...] the layer's cache).
    Per row, every key is scored by dots16 in the blocks of 16 its own slot count holds
    whole and by the scalar loop after them, the softmax runs over its own count, and the
    values are summed block by block in position order: _attend_heads' operations on the
    same operands (f16 rows read in place by kv_block). Scratch: scores [>= (b - a) * group,
    >= slots], stats [1, >= (b - a) *
    group], tile [LANES, Dh]."""
    nr, Dh = b - a, ks.shape[1]
    nmax = 0
    for j in range(a, b):
        nmax = max(nmax, fill[j])
    self_s = stats[0]
    for j in range(nr):
        kr = ks[j]
        for g in range(group):
            acc = np.float32(0.0)
            for i in range(Dh):
                acc += qs[j * group + g, i] * kr[i]
            self_s[j * group + g] = acc * scale
    keys, vals = kc[:, kvh], vc[:, kvh]  # [cap, width], rows strided
    s = 0
    if Dh % LANES == 0:
        while s + LANES <= nmax:
            ahead = min(LANES, nmax - s - LANES)
            if ahead > 0:
                prefetch_rows(keys, s + LANES, ahead)
            src, r = kv_block(keys, s, LANES, tile)
            for j in range(nr):
                if s + LANES <= fill[a + j]:  # else its last keys: the scalar loop's
                    for g in range(group):
                        dots16(src, r, qs, j * group + g, scores, s, scale)
            s += LANES
    for j in range(nr):
        n = fill[a + j]
        t0 = n // LANES * LANES if Dh % LANES == 0 else 0
        for t in range(t0, n):
            src, r = kv_rows(keys, t, 1, tile)
            kr = src[r]
            for g in range(group):
                acc = np.float32(0.0)
                for i in range(Dh):
                    acc += qs[j * group + g, i] * kr[i]
                scores[j * group + g, t] = acc * scale
    for j in range(nr):
        n, p = fill[a + j], pos[a + j]
        g0 = j * group
        _cap_and_mask(scores, self_s, g0, g0 + group, n, cpos, p, window, softcap)
        vr = mem[a + j, v_at + kvh * Dh:v_at + (kvh + 1) * Dh]
        for g in range(group):
            row = scores[g0 + g]
            best = max(self_s[g0 + g], row_max(scores, g0 + g, n))
            e_self = np.exp(self_s[g0 + g] - best)
            exp_shift(row, n, best)
            total = e_self
            for t in range(n):
                total += row[t]
            self_s[g0 + g] = np.float32(1.0) / total
            hq = kvh * group + g
            o = mem[a + j, out_at + hq * Dh:out_at + (hq + 1) * Dh]
            for i in range(Dh):
                o[i] = e_self * vr[i]
    t = 0
    while t < nmax:  # LANES positions at a time, decoded once for all the rows
        m = min(LANES, nmax - t)
        ahead = min(LANES, nmax - t - m)
        if ahead > 0:
            prefetch_rows(vals, t + m, ahead)
        src, r = kv_block(vals, t, m, tile)
        for j in range(nr):
            mj = min(m, fill[a + j] - t)
            if mj > 0:
                o2 = mem[a + j, out_at:out_at + Hq * Dh].reshape((Hq, Dh))
                for g in range(group):
                    wsum_rows(src, r, mj, scores, j * group + g, t, o2, kvh * group + g)
        t += m
    for j in range(nr):
        for g in range(group):
            inv = self_s[j * group + g]
            hq = kvh * group + g
            o = mem[a + j, out_at + hq * Dh:out_at + (hq + 1) * Dh]
            for i in range(Dh):
                o[i] *= inv


@kernel
def _attend(tid, nt, op, model, bufs, kv, p, f32, f16, q8_0):
    """The ATTEND op of worker tid (see the module docstring). kv's k, v are the cache's
    bytes [slots, Hkv, row bytes], whatever its kv_type (so that one compiled step can serve
    all): rows of 4 Dh bytes are float32, of 2 Dh f16 bits, else (Dh/32 * 34) q8_0 blocks;
    f32, f16, q8_0: feats' kv_* (None for the types this step does not read)."""
    k, v = kv[0], kv[1]
    rb, Dh = k.shape[2] * k.itemsize, bufs[7].shape[2]
    if rb == 4 * Dh:
        if f32 is not None:
            _attend_rows(tid, nt, op, model, bufs, kv, k.view(np.float32), v.view(np.float32),
                         p)
    elif rb == 2 * Dh:
        if f16 is not None:
            _attend_rows(tid, nt, op, model, bufs, kv, k.view(np.uint16), v.view(np.uint16), p)
    elif q8_0 is not None:
        _attend_rows(tid, nt, op, model, bufs, kv, k.view(np.uint8), v.view(np.uint8), p)


@kernel
def _attend_scratch(tid, op, consts, kq, scores, Hkv):
    """ATTEND's operands and worker tid's scratch, as both interpreters take them: (o, its
    scale and softcap, the query heads per KV head (group), Hq, Dh, kbuf [Dh], qbuf
    [Hq, Dh], tile [LANES, Dh], scores [Hq, slots] and stats [1, >= Hq]). kq[tid] holds
    Hkv k rows (kbuf the first), Hq q rows, then the tile; scores[tid] Hq rows and stats."""
    o = operands(op, ATTEND)
    Hq = scores.shape[1] - 1
    return (o, np.float32(consts[o.scale]), np.float32(consts[o.softcap]), Hq // Hkv, Hq,
            kq.shape[2], kq[tid, 0], kq[tid, Hkv:Hkv + Hq], kq[tid, Hkv + Hq:],
            scores[tid, :Hq], scores[tid, Hq:])


@kernel
def _attend_vectors(o, mem, shared, private, tid, Hq, Hkv, Dh):
    """ATTEND o's q [Hq * Dh], k, v [Hkv * Dh] and dst [Hq * Dh] in worker tid's arena."""
    return (_vec(mem, shared, private, tid, o.q, Hq * Dh),
            _vec(mem, shared, private, tid, o.k, Hkv * Dh),
            _vec(mem, shared, private, tid, o.v, Hkv * Dh),
            _vec(mem, shared, private, tid, o.dst, Hq * Dh))


@kernel
def _prep_heads(o, consts, params, ints, q, k, kvh, hq, ng, kbuf, qbuf, cos, sin):
    """KV head kvh's k into kbuf [Dh] and query heads hq..hq + ng into qbuf[:ng]: read
    through ATTEND o's perm, normed by its q_norm / k_norm where it has them, rotated."""
    Dh = kbuf.shape[0]
    eps, offset = consts[C_EPS], consts[C_NORM_OFFSET]
    perm = ints[max(o.perm, 0):max(o.perm, 0) + Dh]
    qw = params[max(o.q_norm, 0):max(o.q_norm, 0) + Dh]
    kw = params[max(o.k_norm, 0):max(o.k_norm, 0) + Dh]
    _prep_head(k[kvh * Dh:(kvh + 1) * Dh], perm, o.perm >= 0, kbuf, kw, o.k_norm >= 0, eps,
               offset, cos, sin)
    for g in range(ng):
        _prep_head(q[(hq + g) * Dh:(hq + g + 1) * Dh], perm, o.perm >= 0, qbuf[g], qw,
                   o.q_norm >= 0, eps, offset, cos, sin)


@kernel
def _attend_rows(tid, nt, op, model, bufs, kv, k_all, v_all, p):
    """_attend on the cache's rows k_all, v_all [slots, Hkv, width] as stored (kv_rows)."""
    prog, mats, consts, params, ints, blob, lora = model
    mem, shared, private, xq, xd, xs, xds, kq, scores, state = bufs
    Hkv = k_all.shape[1]
    o, scale, softcap, group, Hq, Dh, kbuf, qbuf, tile, sc, stats = _attend_scratch(
        tid, op, consts, kq, scores, Hkv)
    _, _, pos_all, layers, cos_all, sin_all = kv
    lt = layers[o.layer]
    start, cap, window, slot, n = lt[0], lt[1], lt[2], lt[3], lt[4]
    kc, vc, cpos = k_all[start:start + cap], v_all[start:start + cap], pos_all[start:start + cap]
    cos, sin = cos_all[o.rope:o.rope + 1], sin_all[o.rope:o.rope + 1]
    q, k, v, out = _attend_vectors(o, mem, shared, private, tid, Hq, Hkv, Dh)
    h0, h1 = _heads(Hq, tid, nt)
    kbs = kq[tid, :Hkv]  # every KV head's rotated k
    hq = h0
    while hq < h1:  # prepare the heads of one KV group at a time
        kvh = hq // group
        ng = min(h1, (kvh + 1) * group) - hq
        _prep_heads(o, consts, params, ints, q, k, kvh, hq, ng, kbs[kvh],
                    qbuf[hq - h0:hq - h0 + ng], cos, sin)
        hq += ng
    if h1 > h0:  # then all of them in one pass over the cache
        _attend_heads(qbuf, kbs, v.reshape((Hkv, Dh)), 0, kc[:n], vc[:n], cpos[:n], h0, h1,
                      group, p, window, scale, softcap, sc, stats, out, tile)
    barrier(state, nt)
    for hq in range(h0, h1):  # the worker with a KV head's first query head stores it
        if hq % group == 0:
            kvh = hq // group
            _prep_heads(o, consts, params, ints, q, k, kvh, hq, 0, kbuf, qbuf, cos, sin)
            store_kv_row(kbuf, kc[slot, kvh], tile)
            store_kv_row(v[kvh * Dh:(kvh + 1) * Dh], vc[slot, kvh], tile)
            if kvh == 0:
                cpos[slot] = p


@kernel
def _moe(tid, nt, op, model, bufs, precise, kinds, x16):
    """The MOE op of worker tid: the selected experts, in ascending order, as the
    per-operation path adds them up (arch/moe.py). kinds: feats' matrix types."""
    prog, mats, consts, params, ints, blob, lora = model
    mem, shared, private, xq, xd, xs, xds, kq, scores, state = bufs
    o = operands(op, MOE)
    top_k, F, D = o.top_k, o.inner, mats[o.mat + 2, MAT_ROWS]
    idx = ints[o.idx + tid * top_k:o.idx + (tid + 1) * top_k]
    wts = _vec(mem, shared, private, tid, o.weights, top_k)
    h = _row(mem, shared, private, tid, o.src, D)
    gate, up = _row(mem, shared, private, tid, o.gate, F), _row(mem, shared, private, tid, o.up, F)
    ffn, y = _row(mem, shared, private, tid, o.ffn, F), _row(mem, shared, private, tid, o.y, D)
    x = _row(mem, shared, private, tid, o.dst, D)
    s0 = tid * SLOTS  # this worker's act slots
    hq, hd, hs, hds = _act(xq, xd, xs, xds, ints, s0 + o.slot, D)
    fq, fd, fs, fds = _act(xq, xd, xs, xds, ints, s0 + 1 - o.slot, F)  # the other slot: ffn
    last = -1
    zero = ints[I_ZERO:I_ZERO + 1]  # the row index scatter_add takes
    row0 = np.int64(0)  # not a literal 0: the PROJ op's _mv, not a second compile of it
    for _ in range(top_k):
        e, j = 1 << 62, -1  # the next expert up, and its slot in idx
        for jj in range(top_k):
            if idx[jj] > last and idx[jj] < e:
                e, j = idx[jj], jj
        last = e
        m = o.mat + 3 * e
        r0, r1 = _split(F, tid, nt)
        _mv(blob, mats[m], row0, F, h, hq, hd, hs, hds, gate, r0, r1, precise, kinds, x16)
        _mv(blob, mats[m + 1], row0, F, h, hq, hd, hs, hds, up, r0, r1, precise, kinds, x16)
        _act_rows(o.act, gate[:, r0:r1], up[:, r0:r1], ffn[:, r0:r1])
        barrier(state, nt)
        if not precise:
            quantize_rows(ffn, fq, fd, fs, fds, 0, 1)
        r0, r1 = _split(D, tid, nt)
        _mv(blob, mats[m + 2], row0, D, ffn, fq, fd, fs, fds, y, r0, r1, precise, kinds, x16)
        if r1 > r0:
            scatter_add(x[0, r0:r1].reshape((1, r1 - r0)), zero, wts[j:j + 1],
                        y[0, r0:r1].reshape((1, r1 - r0)))
        barrier(state, nt)


@kernel
def _lora_down(lora, a, R, K, src, t, r0, r1):
    """t[0, r0:r1] = A[r0:r1] @ src[0], A [R, K] float16 bits at lora[a:]."""
    kern(F16, "mvp_rows", lora[a:a + R * K].reshape((R, K)), 32, src, t, r0, r1)


@kernel
def _lora_up(lora, b, R, row0, rows, t, tmp, out, r0, r1):
    """out[0, r] += B[row0 + r] . t[0] for r in [r0, r1), B [., R] float16 bits at lora[b:]."""
    w = lora[b + row0 * R:b + (row0 + rows) * R].reshape((rows, R))
    kern(F16, "mvp_rows", w, 32, t, tmp, r0, r1)
    for r in range(r0, r1):
        out[0, r] += tmp[0, r]


@kernel
def _norm_op(op, mem, shared, private, tid, params, eps, offset):
    """NORM: worker tid's private dst [n] = rmsnorm(src) * (w + offset), the whole vector.
    The row-wise ops here (_norm_op .. _act_op) are _worker's and, once per row on the
    row's arena, batch_step's: a call each, not a one-op program each (batch_step.py)."""
    o = operands(op, NORM)
    rmsnorm(_row(mem, shared, private, tid, o.src, o.n), params[o.weight:o.weight + o.n], eps,
            offset, _row(mem, shared, private, tid, o.dst, o.n))


@kernel
def _quant_op(op, mem, shared, private, tid, xq, xd, xs, xds, ints):
    """QUANT: src [n] into worker tid's int8 (int16) activation slot, whole."""
    o = operands(op, QUANT)
    if o.sb != 0:
        aq, ad, ab = _act_k(xq, xd, xs, ints, tid * SLOTS + o.slot, o.n)
        quantize_rows_k(_row(mem, shared, private, tid, o.src, o.n), aq, ad, ab, 0, 1)
    else:
        _quant_op32(op, mem, shared, private, tid, xq, xd, xs, xds, ints)


@kernel
def _quant_op32(op, mem, shared, private, tid, xq, xd, xs, xds, ints):
    """_quant_op of a program without super-block slots (no K-quant matrix: sb is 0)."""
    o = operands(op, QUANT)
    aq, ad, asum, ads = _act(xq, xd, xs, xds, ints, tid * SLOTS + o.slot, o.n)
    quantize_rows(_row(mem, shared, private, tid, o.src, o.n), aq, ad, asum, ads, 0, 1)


def quant_slot(kinds, op, mem, shared, private, tid, xq, xd, xs, xds, ints):
    """_quant_op where kinds holds a K-quant code (super-block slots: fused.SB_TYPES), else
    _quant_op32: a step without K-quant matrices compiles no super-block quantizer."""
    raise NotImplementedError("quant_slot runs in kernels only")


@overload(quant_slot, jit_options=GLUE)
def _quant_slot(kinds, op, mem, shared, private, tid, xq, xd, xs, xds, ints):
    quant = _quant_op if set(codes_of(kinds)) & set(KK_CODES) else _quant_op32

    def impl(kinds, op, mem, shared, private, tid, xq, xd, xs, xds, ints):
        quant(op, mem, shared, private, tid, xq, xd, xs, xds, ints)
    return impl


@kernel
def _add_op(op, mem, shared, private, tid, nt, consts):
    """ADD: dst[r] += src[r] (* consts[scale] where scale >= 0), worker tid's rows r."""
    o = operands(op, ADD)
    r0, r1 = _split(o.n, tid, nt)
    if r1 > r0:
        dst = _vec(mem, shared, private, tid, o.dst, o.n)[r0:r1]
        src = _vec(mem, shared, private, tid, o.src, o.n)[r0:r1]
        if o.scale >= 0:
            c = np.float32(consts[o.scale])
            for r in range(r1 - r0):
                dst[r] += src[r] * c
        else:
            add_inplace(dst.reshape((1, r1 - r0)), src.reshape((1, r1 - r0)))


@kernel
def _act_op(op, mem, shared, private, tid, nt):
    """ACT: dst[r] = act(gate[r]) * up[r], worker tid's rows r."""
    o = operands(op, ACT)
    r0, r1 = _split(o.n, tid, nt)
    if r1 > r0:
        g = _vec(mem, shared, private, tid, o.gate, o.n)[r0:r1].reshape((1, r1 - r0))
        u = _vec(mem, shared, private, tid, o.up, o.n)[r0:r1].reshape((1, r1 - r0))
        out = _vec(mem, shared, private, tid, o.dst, o.n)[r0:r1].reshape((1, r1 - r0))
        _act_rows(o.kind, g, u, out)


@kernel
def _worker(tid, nt, model, bufs, kv, p, precise, kinds, kv_f32, kv_f16, kv_q8_0, moe,
            lora_ops, x16):
    """Worker tid's run of the whole program (see the module docstring); kinds .. x16:
    feats (kinds its first N_KINDS entries; lora_ops: its "lora", not to be confused with
    the model's LoRA table)."""
    prog, mats, consts, params, ints, blob, lora = model
    mem, shared, private, xq, xd, xs, xds, kq, scores, state = bufs
    eps, offset = consts[C_EPS], consts[C_NORM_OFFSET]
    for i in range(prog.shape[0]):
        op = prog[i]
        code = opcode(op)
        if code == BARRIER:
            barrier(state, nt)
        elif code == NORM:
            _norm_op(op, mem, shared, private, tid, params, eps, offset)
        elif code == QUANT:
            if not precise:
                quant_slot(kinds, op, mem, shared, private, tid, xq, xd, xs, xds, ints)
        elif code == PROJ:
            o = operands(op, PROJ)
            r0, r1 = _split(o.rows, tid, nt)
            h = _row(mem, shared, private, tid, o.src, o.cols)
            out = _row(mem, shared, private, tid, o.dst, o.rows)
            _proj_row(blob, mats[o.mat], o, h, xq, xd, xs, xds, ints, tid * SLOTS + o.slot,
                      out, r0, r1, precise, kinds, x16)
            if o.bias >= 0:
                b = params[o.bias:o.bias + o.rows]
                for r in range(r0, r1):
                    out[0, r] += b[r]
        elif code == ADD:
            _add_op(op, mem, shared, private, tid, nt, consts)
        elif code == ACT:
            _act_op(op, mem, shared, private, tid, nt)
        elif code == SCALE:
            o = operands(op, SCALE)
            r0, r1 = _split(o.n, tid, nt)
            buf = _vec(mem, shared, private, tid, o.buf, o.n)
            c = np.float32(consts[o.factor])
            for r in range(r0, r1):
                buf[r] *= c
        elif code == SOFTCAP:
            o = operands(op, SOFTCAP)
            r0, r1 = _split(o.n, tid, nt)
            buf = _vec(mem, shared, private, tid, o.buf, o.n)
            c = np.float32(consts[o.cap])
            for r in range(r0, r1):
                buf[r] = np.tanh(buf[r] / c) * c
        elif code == ATTEND:
            _attend(tid, nt, op, model, bufs, kv, p, kv_f32, kv_f16, kv_q8_0)
        elif code == ROUTE and moe is not None:
            o = operands(op, ROUTE)
            k = o.top_k
            route(_row(mem, shared, private, tid, o.logits, o.experts), k, o.renorm != 0,
                  ints[o.idx + tid * k:o.idx + (tid + 1) * k].reshape((1, k)),
                  _row(mem, shared, private, tid, o.weights, k))
        elif code == MOE and moe is not None:
            _moe(tid, nt, op, model, bufs, precise, kinds, x16)
        elif code == LORA_A and lora_ops is not None:
            o = operands(op, LORA_A)
            r0, r1 = _heads(o.rank, tid, nt) if o.split else (0, o.rank)
            _lora_down(lora, o.a, o.rank, o.cols, _row(mem, shared, private, tid, o.src, o.cols),
                       _row(mem, shared, private, tid, o.dst, o.rank), r0, r1)
        elif code == LORA_B and lora_ops is not None:
            o = operands(op, LORA_B)
            r0, r1 = _split(o.rows, tid, nt)
            if r1 > r0:
                _lora_up(lora, o.b, o.rank, o.row0, o.rows,
                         _row(mem, shared, private, tid, o.t, o.rank),
                         _row(mem, shared, private, tid, o.tmp, o.rows),
                         _row(mem, shared, private, tid, o.dst, o.rows), r0, r1)


@kernel
def _split_feats(feats):
    """(kinds, kv_f32, kv_f16, kv_q8_0, moe, lora, x16): _worker's feature arguments."""
    return (feats[:N_KINDS], feats[KV_F32], feats[KV_F16], feats[KV_Q8_0], feats[F_MOE],
            feats[F_LORA], feats[F_X16])


@kernel(parallel=True)
def decode_parallel(nt, model, bufs, kv, p, precise, feats):
    """One decode step on nt threads (nt == numba.get_num_threads(), omp layer).

    model = (prog, mats, consts, params, ints, blob, lora): the program and its tables
    (lora: the LoRA matrices' float16 bits, flat);
    bufs = (mem, shared, private, xq, xd, xs, xds, kq, scores, state): the arena, the int8
    act slots (flat: nt * SLOTS slots of ints[I_KMAX] values), attention scratch and the
    barrier; kv = (k, v, pos, layers, cos, sin): the cache of every layer as bytes
    [slots, Hkv, row bytes] (float32, f16 or q8_0 rows: kv_types.py),
    the layer table and this position's RoPE rows [sets, Dh/2]; p: the position;
    feats: what the program uses (the module docstring).
    """
    for tid in prange(nt):  # tid as int64: prange's is uint64, which would compile _worker
        _worker(np.int64(tid), nt, model, bufs, kv, p, precise,  # a second time
                *_split_feats(feats))


@kernel
def decode_serial(model, bufs, kv, p, precise, feats):
    """One decode step on the calling thread."""
    # int64s, not literals: decode_parallel's _worker, not a third compile of it
    _worker(np.int64(0), np.int64(1), model, bufs, kv, p, precise, *_split_feats(feats))
