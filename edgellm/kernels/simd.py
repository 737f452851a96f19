"""Block dot products emitted as LLVM vector IR through `numba.extending.intrinsic`.

Plain Numba loops do not vectorize int8 block dot products well (kernels.md), so the loop
over one weight row's blocks is written here as IR. Each intrinsic computes a tile of
outputs, RW consecutive weight rows i.. times RT consecutive activation rows t.., over all
K columns, and stores them to out[t + s, i + r]. Weights are read as ggml's blocks as
stored (quant.py): nothing is repacked or copied.

Two SIMD paths, chosen once at import (`SIMD_PATH`):
  "vnni"      `llvm.x86.avx512.vpdpbusd.512` (u8 x s8 -> i32, 4 products per lane) on 64
              columns at a time: q4 weights are unsigned nibbles times signed activations
              with the -8 / +m offsets folded in afterwards; q8_0 uses |w| . sign(w) x.
              Chosen only where llvmlite reports avx512vnni and avx512vl for the host and
              numba compiles for the host CPU (not NUMBA_CPU_NAME=generic).
  "portable"  the same dot as sext/zext, mul and pairwise adds in generic vector IR: x86
              lowers it to vpmaddwd, aarch64 to its own multiply-adds. Forced with
              EDGELLM_PORTABLE=1.
Float work (scales, float activations, f32/f16 weights) is generic vector IR on both paths.

Row groups (B = 32): tile_<type>_8x1 (decode) reduces the 8 rows' int8 dot products of a
block to one <8 x i32> (vphaddd), so scales, offsets and the multiply-add are done once per
block for 8 rows as vectors; it prefetches the next group's bytes (8 rows side by side
are 8 streams the hardware prefetcher follows badly). See _group_codegen. Prefill packs
row groups into panels instead (panel.py), where no horizontal sums are needed.

Activation side (int8 mode, blocks of 32): xq int8 [T, K], xd float32 [T, K/32] scales,
xds float32 [T, K/32] = xd * (sum of the block's xq) (ggml's q8_1 "s"). With it the q4_0
offset and the q4_1 minimum cost one multiply-add per block and row:
  q4_0: sum_j d(q_j - 8) dx x_j = d dx (q . x) - 8 d xds
  q4_1: sum_j (d q_j + m) dx x_j = d dx (q . x) + m xds
Block sizes 64 and 128 reuse the 32-element activation blocks: a weight block's scale
multiplies the sum over its 2 or 4 activation sub-blocks, each with its own dx.

Caching (numba#1833): numba's cache key for a kernel covers only its own source file, not
intrinsics or jitted functions it calls from other modules, nor the SIMD path. Kernels
are therefore defined with `@kernel`, which caches them in a subdirectory of
NUMBA_CACHE_DIR named by CACHE_TAG: KERNEL_VERSION, SIMD_PATH and a hash of this file,
panel.py, act_quant.py, matvec.py, matmul.py, sync.py (the decode step's barrier),
fastexp.py, activations.py, attention.py and dots.py (what the decode step calls). Editing any
of them or switching path never loads a stale kernel. A kernel elsewhere that calls these
intrinsics or kernels (a fused decode step, say) should be defined with `@kernel` too, so
that it is cached under the same tag; bump KERNEL_VERSION when a change the hash does not
see must invalidate cached kernels (a global LLVM option, a helper module). Old tag
directories are not deleted.
"""

from __future__ import annotations

# isort: off
from .. import numba_setup  # noqa: F401  (numba's environment: must come before numba)
# isort: on
import contextlib
import hashlib
import os

import llvmlite.binding as llb
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.core.errors import TypingError
from numba.extending import intrinsic

KERNEL_VERSION = 2
OPTIONS = dict(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, cache=True)
BLOCK_BYTES = {"q8_0": (2, 1), "q4_0": (2, 2), "q4_1": (4, 2)}  # (header bytes, elems/byte)
KINDS = ("q8_0", "q4_0", "q4_1")
BLOCKS = (32, 64, 128)


def _target_features() -> set[str]:
    """CPU features numba compiles for: NUMBA_CPU_FEATURES if set ("" for
    NUMBA_CPU_NAME=generic), else the host's (as numba.core.codegen does)."""
    if config.CPU_FEATURES is not None:
        return {f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+")}
    from numba.core.codegen import get_host_cpu_features

    return {f[1:] for f in get_host_cpu_features().split(",") if f.startswith("+")}


def _select_path() -> str:
    if os.environ.get("EDGELLM_PORTABLE", "").strip().lower() not in ("", "0", "false", "no"):
        return "portable"
    if (config.CPU_NAME or "").strip().lower() == "generic":
        return "portable"
    host = llb.get_host_cpu_features()
    need = ("avx512vnni", "avx512vl")
    if all(host.get(f) for f in need) and all(f in _target_features() for f in need):
        return "vnni"
    return "portable"


def _native_f16() -> bool:
    """Does the compile target convert float16 in hardware (x86: F16C; aarch64: always)?"""
    import platform

    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return "f16c" in _target_features()
    return machine in ("aarch64", "arm64")


SIMD_PATH = _select_path()
VNNI = SIMD_PATH == "vnni"
NATIVE_F16 = _native_f16()  # else f16 scales are converted in integer IR (_h2f)

# The kernel sources the tag covers: this file and the kernel modules built on it.
_SOURCES = ("simd.py", "panel.py", "act_quant.py", "matvec.py", "matmul.py", "sync.py",
            "fastexp.py", "activations.py", "attention.py", "dots.py")


def _sources_hash() -> str:
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _SOURCES:
        try:
            with open(os.path.join(here, name), "rb") as f:
                h.update(f.read())
        except OSError:  # e.g. a zipped install: fall back on KERNEL_VERSION alone
            h.update(name.encode())
    return h.hexdigest()[:10]


CACHE_TAG = f"k{KERNEL_VERSION}-{SIMD_PATH}{'' if NATIVE_F16 else '-softf16'}-{_sources_hash()}"


@contextlib.contextmanager
def _cache_scope():
    """numba reads config.CACHE_DIR when a cached dispatcher is created: point it at our tag."""
    previous = config.CACHE_DIR
    if previous:
        config.CACHE_DIR = os.path.join(previous, "edgellm-" + CACHE_TAG)
    try:
        yield
    finally:
        config.CACHE_DIR = previous


def kernel(fn=None, *, parallel: bool = False, exact: bool = False):
    """`@njit(**OPTIONS)` (parallel if asked), cached under CACHE_TAG. Module-level use only.

    exact=True drops fastmath: numba puts fast-math flags on every float instruction of a
    fastmath function, the intrinsics' included, which would let LLVM turn x / 127 into
    x * (1 / 127) where a result must match the reference bit for bit.
    """
    opts = dict(OPTIONS, fastmath=False) if exact else OPTIONS

    def wrap(f):
        with _cache_scope():
            return numba.njit(parallel=parallel, **opts)(f)
    return wrap if fn is None else wrap(fn)


# ---------------------------------------------------------------------------------------
# IR helpers
I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32 = ir.HalfType(), ir.FloatType()
BYTES = I8.as_pointer()
FAST = ("fast",)


def _v(t, n):
    return ir.VectorType(t, n)


def _c(t, v):
    return ir.Constant(t, v)


def _i64(v):
    return ir.Constant(I64, v)


class _Rows:
    """A 2-D array argument seen as byte-addressed rows."""

    def __init__(self, ctx, b, ty, val):
        a = ctx.make_array(ty)(ctx, b, val)
        self.b = b
        self.data = b.bitcast(a.data, BYTES)
        self.stride = b.extract_value(a.strides, 0)
        self.cols = b.extract_value(a.shape, 1)

    def row(self, r):
        return self.b.gep(self.data, [self.b.mul(r, self.stride)], inbounds=True)


def _load(b, base, off, ty):
    """Unaligned load of `ty` at byte offset `off` (int or i64 value) from i8* base."""
    if isinstance(off, int):
        off = _i64(off)
    p = b.gep(base, [off], inbounds=True)
    return b.load(b.bitcast(p, ty.as_pointer()), align=1)


def _h2f(b, bits):
    """float16 bit patterns (i16 or <n x i16>) -> float32 (or <n x f32>).

    Targets without a half-precision conversion instruction (x86 without F16C, e.g.
    NUMBA_CPU_NAME=generic) get it in integer IR: LLVM would call a runtime library
    function there that numba's JIT does not provide.
    """
    vec = isinstance(bits.type, ir.VectorType)
    n = bits.type.count if vec else 0
    f32 = _v(F32, n) if vec else F32
    if NATIVE_F16:
        return b.fpext(b.bitcast(bits, _v(F16, n) if vec else F16), f32)
    i32 = _v(I32, n) if vec else I32

    def k(v):
        return _c(i32, [v] * n) if vec else _c(I32, v)

    x = b.zext(bits, i32)
    o = b.shl(b.and_(x, k(0x7FFF)), k(13))  # exponent and mantissa, in place
    e = b.and_(o, k(0x7C00 << 13))
    o = b.add(o, k((127 - 15) << 23))
    inf = b.add(o, k((128 - 16) << 23))  # inf / nan keep an all-ones exponent
    magic = b.bitcast(k(113 << 23), f32)
    sub = b.bitcast(b.fsub(b.bitcast(b.add(o, k(1 << 23)), f32), magic), i32)  # zero/subnormal
    o = b.select(b.icmp_unsigned("==", e, k(0x7C00 << 13)), inf, o)
    o = b.select(b.icmp_unsigned("==", e, k(0)), sub, o)
    return b.bitcast(b.or_(o, b.shl(b.and_(x, k(0x8000)), k(16))), f32)


def _f16(b, base, off):
    return _h2f(b, _load(b, base, off, I16))


def _splat(b, x, n):
    v = b.insert_element(ir.Constant(_v(x.type, n), ir.Undefined), x, _c(I32, 0))
    return b.shuffle_vector(v, v, _c(_v(I32, n), [0] * n))


def _pick(b, v, idx, other=None):
    return b.shuffle_vector(v, v if other is None else other, _c(_v(I32, len(idx)), list(idx)))


def _hsum(b, v):
    """Sum of a float vector's lanes (halving tree)."""
    n = v.type.count
    while n > 1:
        n //= 2
        v = b.fadd(_pick(b, v, range(n)), _pick(b, v, range(n, 2 * n)), flags=FAST)
    return b.extract_element(v, _c(I32, 0))


def _pairsum(b, p):
    """<n x i32> products -> <n/4 x i32>: lane j sums products 4j..4j+3 (vpdpbusd's grouping)."""
    n = p.type.count
    p = b.add(_pick(b, p, range(0, n, 2)), _pick(b, p, range(1, n, 2)))
    return b.add(_pick(b, p, range(0, n // 2, 2)), _pick(b, p, range(1, n // 2, 2)))


def _dot_us(b, u8, s8):
    """<n/4 x i32> partial sums of unsigned u8 x signed s8 (n = 32 or 64 lanes)."""
    n = u8.type.count
    if VNNI:
        vi = _v(I32, n // 4)
        fn = _llvm_fn(b, f"llvm.x86.avx512.vpdpbusd.{8 * n}", vi, [vi] * 3)
        return b.call(fn, [_c(vi, [0] * (n // 4)), b.bitcast(u8, vi), b.bitcast(s8, vi)])
    return _pairsum(b, b.mul(b.zext(u8, _v(I32, n)), b.sext(s8, _v(I32, n))))


def _weight_dot(b, kind, w):
    """dot(x) -> partial sums of w . x for int8 activation vectors x (w's lane count)."""
    if kind != "q8_0":  # unsigned nibbles
        def dot(x):
            return _dot_us(b, w, x)
        return dot
    return _signed_dot(b, w)


def _signed_dot(b, w):
    """dot(x) for signed int8 weights w: VNNI needs |w| . sign(w) x (u8 x s8)."""
    if not VNNI:
        n = w.type.count
        return lambda x: _pairsum(b, b.mul(b.sext(w, _v(I32, n)), b.sext(x, _v(I32, n))))
    zero = _c(w.type, [0] * w.type.count)
    neg = b.icmp_signed("<", w, zero)
    absw = b.select(neg, b.sub(zero, w), w)
    return lambda x: _dot_us(b, absw, b.select(neg, b.sub(zero, x), x))


def _nibbles(b, base, off, B):
    """B 4-bit values (quant.py's order: low nibbles are elements 0..B/2-1) as <B x i8>."""
    raw = _load(b, base, off, _v(I8, B // 2))
    lo = b.and_(raw, _c(_v(I8, B // 2), [15] * (B // 2)))
    hi = b.lshr(raw, _c(_v(I8, B // 2), [4] * (B // 2)))
    return _pick(b, lo, range(B), hi)


def _loop(b, count, init, body, unroll=1):
    """Emit `for k in range(count)` threading the values `init` through body(k, state).

    With unroll > 1 the main loop runs `unroll` bodies per iteration, each on its own copy
    of the state (independent dependency chains); the tail runs on copy 0. Returns the
    `unroll` final states.
    """
    states = [list(init) for _ in range(unroll)]
    if unroll > 1:
        flat = [v for s in states for v in s]
        n = len(init)

        def multi(k, st):
            base = b.mul(k, _i64(unroll))
            out = []
            for u in range(unroll):
                out += body(b.add(base, _i64(u)), st[u * n:(u + 1) * n])
            return out

        flat = _for(b, _i64(0), b.sdiv(count, _i64(unroll)), flat, multi)
        states = [flat[u * n:(u + 1) * n] for u in range(unroll)]
        start = b.mul(b.sdiv(count, _i64(unroll)), _i64(unroll))
    else:
        start = _i64(0)
    states[0] = _for(b, start, count, states[0], body)
    return states


def _for(b, start, stop, state, body):
    pre = b.block
    loop = b.append_basic_block("loop")
    done = b.append_basic_block("done")
    b.cbranch(b.icmp_signed("<", start, stop), loop, done)
    b.position_at_end(loop)
    k = b.phi(I64)
    k.add_incoming(start, pre)
    phis = []
    for v in state:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        phis.append(p)
    new = body(k, phis)
    k1 = b.add(k, _i64(1))
    end = b.block
    k.add_incoming(k1, end)
    for p, v in zip(phis, new, strict=True):
        p.add_incoming(v, end)
    b.cbranch(b.icmp_signed("<", k1, stop), loop, done)
    b.position_at_end(done)
    out = []
    for s, v in zip(state, new, strict=True):
        p = b.phi(v.type)
        p.add_incoming(s, pre)
        p.add_incoming(v, end)
        out.append(p)
    return out


def _llvm_fn(b, name, ret, args):
    return cgutils.get_or_insert_function(b.module, ir.FunctionType(ret, args), name)


def _store(b, out, t, i, value):
    """out[t, i] = value (float32)."""
    p = b.gep(out.row(t), [b.mul(i, _i64(4))], inbounds=True)
    b.store(value, b.bitcast(p, F32.as_pointer()), align=4)


# ---------------------------------------------------------------------------------------
# int8 activations x quantized weights


def _q8act_codegen(kind, B, RW, RT):
    """Tile codegen for int8 activations.

    The loop works on 64 columns per dot product (vpdpbusd on 512 bits): two activation
    blocks, from two weight blocks (B = 32), one (B = 64) or half of one (B = 128). The
    per-block scales travel as pairs: sum += dot_lanes * (dw dx) with lanes 0-7 of the
    first block and 8-15 of the second. With B = 32 an odd block count leaves one block,
    done at the end on 256 bits.
    """
    hdr, per_byte = BLOCK_BYTES[kind]
    BB = hdr + B // per_byte
    E = max(64, B)  # columns per loop step
    NW = E // B  # weight blocks per step
    U = E // 64  # 64-column units per step
    q4 = kind != "q8_0"

    def units(b, p):
        """The weight step at p: [(<64 x i8> weights, <2 x f32> scales, <2 x f32> minima)]."""
        if B == 32:
            p1 = b.gep(p, [_i64(BB)], inbounds=True)
            h = [_load(b, q, 0, I16) for q in (p, p1)]
            d2 = _pair16(b, h[0], h[1])
            m2 = _pair16(b, _load(b, p, 2, I16), _load(b, p1, 2, I16)) if kind == "q4_1" else None
            if kind == "q8_0":
                w = _pick(b, _load(b, p, 2, _v(I8, 32)), range(64), _load(b, p1, 2, _v(I8, 32)))
            else:
                raw = _pick(b, _load(b, p, hdr, _v(I8, 16)), range(32),
                            _load(b, p1, hdr, _v(I8, 16)))
                lo = b.and_(raw, _c(_v(I8, 32), [15] * 32))
                hi = b.lshr(raw, _c(_v(I8, 32), [4] * 32))
                order = [*range(16), *range(32, 48), *range(16, 32), *range(48, 64)]
                w = _pick(b, lo, order, hi)
            return [(w, d2, m2)]
        d2 = _splat(b, _f16(b, p, 0), 2)
        m2 = _splat(b, _f16(b, p, 2), 2) if kind == "q4_1" else None
        if kind == "q8_0":
            ws = [_load(b, p, 2 + 64 * h, _v(I8, 64)) for h in range(U)]
        else:
            full = _nibbles(b, p, hdr, B)
            ws = [full] if B == 64 else [_pick(b, full, range(64 * h, 64 * h + 64))
                                         for h in range(U)]
        return [(w, d2, m2) for w in ws]

    def codegen(ctx, b, sig, args):
        w, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
        i, t = args[1], args[5]
        K = xq.cols
        wrow = [w.row(b.add(i, _i64(r))) for r in range(RW)]
        xrow = [xq.row(b.add(t, _i64(r))) for r in range(RT)]
        drow = [xd.row(b.add(t, _i64(r))) for r in range(RT)]
        srow = [xds.row(b.add(t, _i64(r))) for r in range(RT)]
        n = RW * RT
        init = [_c(_v(F32, 16), [0.0] * 16)] * n + ([_c(_v(F32, 2), [0.0] * 2)] * n if q4 else [])
        expand = [0] * 8 + [1] * 8

        def body(k, st):
            acc, fix = list(st[:n]), list(st[n:])
            a0 = b.mul(k, _i64(E // 32))  # first activation block of the step
            ablk = [b.add(a0, _i64(2 * h)) for h in range(U)]
            # activation side, shared by the RW rows: int8 vectors, scales as 16 lanes
            xs = [[_load(b, xrow[s], b.mul(a, _i64(32)), _v(I8, 64)) for a in ablk]
                  for s in range(RT)]
            dx = [[_pick(b, _load(b, drow[s], b.mul(a, _i64(4)), _v(F32, 2)), expand)
                   for a in ablk] for s in range(RT)]
            ds = [[_load(b, srow[s], b.mul(a, _i64(4)), _v(F32, 2)) if q4 else None
                   for a in ablk] for s in range(RT)]
            for r in range(RW):
                us = units(b, b.gep(wrow[r], [b.mul(k, _i64(NW * BB))], inbounds=True))
                for h, (wv, d2, m2) in enumerate(us):
                    dot = _weight_dot(b, kind, wv)
                    dw = _pick(b, d2, expand)  # shared by the RT tokens
                    for s in range(RT):
                        j = r * RT + s
                        f = b.fmul(b.sitofp(dot(xs[s][h]), _v(F32, 16)), dx[s][h], flags=FAST)
                        acc[j] = b.fadd(acc[j], b.fmul(f, dw, flags=FAST), flags=FAST)
                        if q4:
                            fm = d2 if kind == "q4_0" else m2
                            fix[j] = b.fadd(fix[j], b.fmul(fm, ds[s][h], flags=FAST),
                                            flags=FAST)
            return acc + fix

        nstep = b.sdiv(K, _i64(E))
        states = _loop(b, nstep, init, body, unroll=2 if n == 1 else 1)
        final = states[0]
        for st in states[1:]:
            final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
        res = []
        for j in range(n):
            v = _hsum(b, final[j])
            if q4:
                f = b.fadd(b.extract_element(final[n + j], _c(I32, 0)),
                           b.extract_element(final[n + j], _c(I32, 1)), flags=FAST)
                if kind == "q4_0":
                    f = b.fmul(f, _c(F32, -8.0), flags=FAST)
                v = b.fadd(v, f, flags=FAST)
            res.append(v)
        if B == 32:  # the last block when K / 32 is odd
            res = _for(b, b.mul(nstep, _i64(2)), b.sdiv(K, _i64(32)), res,
                       lambda bi, st: _last_block(b, kind, bi, wrow, xrow, drow, srow, st, RT))
        for r in range(RW):
            for s in range(RT):
                _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)), res[r * RT + s])
        return ctx.get_dummy_value()

    return codegen


def _prefetch_ahead(b, nxt, bi, nbytes):
    """Hint the nbytes at nxt + bi * nbytes into the cache: rows read side by side are as
    many streams, which the hardware prefetcher follows badly, so a tile fetches the rows
    after it linearly, as much per block as it consumes (a hint: never faults, also past
    the end of the matrix)."""
    pf = _llvm_fn(b, "llvm.prefetch.p0", ir.VoidType(), [BYTES, I32, I32, I32])
    ahead = b.gep(nxt, [b.mul(bi, _i64(nbytes))])
    for c in range(0, nbytes, 64):
        b.call(pf, [b.gep(ahead, [_i64(c)]), _c(I32, 0), _c(I32, 3), _c(I32, 1)])


def _q8act_row_codegen(kind, RW=1):
    """Tile codegen for RW weight rows (RW > 1: q8_0 only) x one token, B = 32, on 256 bits
    per block.

    With nothing to share between rows or tokens, the 64-column units of _q8act_codegen
    lose to this: their 512-bit ops take two cycles each on Zen 4, against a scalar
    dw * dx broadcast over 8 lanes per block here (notes/qmv_sketch.py's scheme).
    q8_0 on VNNI with RW > 1: the rows share the activation block and its -128 sum(x) (one
    vpdpbusd per block), and each row's dot is (w + 128) . x from there: one xor per row
    instead of the |w| . sign(w) x trick's three operations. The lane sums are the same
    integers either way, so the results are too.
    """
    hdr, per_byte = BLOCK_BYTES[kind]
    BB = hdr + 32 // per_byte
    q4 = kind != "q8_0"
    assert RW == 1 or not q4
    flip_trick = VNNI and RW > 1
    v8 = _v(F32, 8)

    def codegen(ctx, b, sig, args):
        w, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
        i, t = args[1], args[5]
        wrows = [w.row(b.add(i, _i64(r))) for r in range(RW)]
        xrow, drow, srow = xq.row(t), xd.row(t), xds.row(t)
        init = [_c(v8, [0.0] * 8)] * RW + ([_c(F32, 0.0)] if q4 else [])
        zero_i = _c(_v(I32, 8), [0] * 8)
        flip = _c(_v(I8, 32), [-128] * 32)
        nxt = w.row(b.add(i, _i64(PF_ROWS * RW)))  # the rows PF_ROWS tiles ahead

        def body(bi, st):
            x = _load(b, xrow, b.mul(bi, _i64(32)), _v(I8, 32))
            dx = _load(b, drow, b.mul(bi, _i64(4)), F32)
            if RW > 1:
                _prefetch_ahead(b, nxt, bi, RW * BB)
            if flip_trick:
                bias = b.sub(zero_i, _dot_acc(b, zero_i, flip, x))
            out = []
            for r in range(RW):
                p = b.gep(wrows[r], [b.mul(bi, _i64(BB))], inbounds=True)
                dw = _f16(b, p, 0)
                if flip_trick:
                    dot = _dot_acc(b, bias, b.xor(_load(b, p, 2, _v(I8, 32)), flip), x)
                else:
                    wv = _load(b, p, 2, _v(I8, 32)) if kind == "q8_0" else _nibbles(b, p, hdr, 32)
                    dot = _weight_dot(b, kind, wv)(x)
                scale = _splat(b, b.fmul(dw, dx, flags=FAST), 8)
                out.append(b.fadd(st[r], b.fmul(b.sitofp(dot, v8), scale, flags=FAST),
                                  flags=FAST))
            if q4:  # RW == 1: p and dw are the row's
                fm = dw if kind == "q4_0" else _f16(b, p, 2)
                ds = _load(b, srow, b.mul(bi, _i64(4)), F32)
                out.append(b.fadd(st[RW], b.fmul(fm, ds, flags=FAST), flags=FAST))
            return out

        states = _loop(b, b.sdiv(xq.cols, _i64(32)), init, body, unroll=2)
        for r in range(RW):
            res = b.fadd(_hsum(b, states[0][r]), _hsum(b, states[1][r]), flags=FAST)
            if q4:
                fix = b.fadd(states[0][RW], states[1][RW], flags=FAST)
                if kind == "q4_0":
                    fix = b.fmul(fix, _c(F32, -8.0), flags=FAST)
                res = b.fadd(res, fix, flags=FAST)
            _store(b, out, t, b.add(i, _i64(r)), res)
        return ctx.get_dummy_value()

    return codegen


GROUP = 8  # weight rows of a row-group tile (B = 32)
PF_ROWS = 2  # prefetch distance of the q8_0 multi-row tile, in tiles
PF_GROUPS = 2  # prefetch distance of the row-group tiles, in groups (1: 4-7% slower from DRAM)
# the output lane of each row after _group_reduce: pairs of rows share a vector
_PAIR_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _dot_acc(b, acc, u8, s8):
    """acc + the <n/4 x i32> partial sums of unsigned u8 x signed s8 (32 lanes)."""
    n = u8.type.count
    if VNNI:
        vi = _v(I32, n // 4)
        fn = _llvm_fn(b, f"llvm.x86.avx512.vpdpbusd.{8 * n}", vi, [vi] * 3)
        return b.call(fn, [acc, b.bitcast(u8, vi), b.bitcast(s8, vi)])
    return b.add(acc, _pairsum(b, b.mul(b.zext(u8, _v(I32, n)), b.sext(s8, _v(I32, n)))))


def group_blocks(b, nblocks, RT, body, out, t, i, order):
    """Run body(block, acc) over the blocks with RT <8 x f32> accumulators (two chains when
    RT == 1), then store lane k of token s's sum to out[t + s, i + order[k]]."""
    init = [_c(_v(F32, 8), [0.0] * 8)] * RT
    states = _loop(b, nblocks, init, body, unroll=2 if RT == 1 else 1)
    final = states[0]
    for st in states[1:]:
        final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
    for s in range(RT):
        for lane, r in enumerate(order):
            _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)),
                   b.extract_element(final[s], _c(I32, lane)))


def scale_block(b, kind, tot, drow, srow, foff, dw, mw, acc):
    """acc + one block's <8 x i32> int8 dot products `tot` (a lane per weight row) as floats:
    tot dx dw, minus 8 dw xds (q4_0) or plus mw xds (q4_1); dx and xds at byte offset foff
    of the activation rows drow, srow; dw, mw <8 x f32>. The row-group and panel tiles' float
    work per block, in this order in both."""
    v8 = _v(F32, 8)
    dx = _splat(b, _load(b, drow, foff, F32), 8)
    f = b.fmul(b.sitofp(tot, v8), dx, flags=FAST)
    if kind == "q4_0":
        ds = _load(b, srow, foff, F32)
        f = b.fadd(f, _splat(b, b.fmul(ds, _c(F32, -8.0), flags=FAST), 8), flags=FAST)
    acc = b.fadd(acc, b.fmul(f, dw, flags=FAST), flags=FAST)
    if kind == "q4_1":
        ds = _splat(b, _load(b, srow, foff, F32), 8)
        acc = b.fadd(acc, b.fmul(mw, ds, flags=FAST), flags=FAST)
    return acc


def _hadd(b, u, v):
    """Horizontal pair sums of two <8 x i32> within 128-bit halves (x86 vphaddd)."""
    lo = _pick(b, u, (0, 2, 8, 10, 4, 6, 12, 14), v)
    hi = _pick(b, u, (1, 3, 9, 11, 5, 7, 13, 15), v)
    return b.add(lo, hi)


def _group_codegen(kind, RT):
    """Tile codegen for GROUP weight rows x RT tokens, B = 32: one vector per block.

    Per block the int8 dot products of all rows are reduced to one <8 x i32> (one lane a
    row), so the per-block float work (scales, the q4 offset, the multiply-add) is done
    once for the 8 rows as vectors, not once per row. q4: two rows share a 256-bit
    vector ([row a's 16 nibble bytes | row b's]), low nibbles against the activation's
    first 16 values broadcast to both halves and high nibbles against its last 16, so each
    row's sum sits in 4 lanes; q8_0: one row per vector, on VNNI as (w + 128) . x (the
    weights made unsigned by one xor per row, shared by the tokens) with each sum started
    at -128 sum(x) (one vpdpbusd per token): exactly w . x in the integers.
    """
    hdr, per_byte = BLOCK_BYTES[kind]
    BB = hdr + 32 // per_byte
    R = GROUP
    q4 = kind != "q8_0"
    order = _PAIR_ORDER if q4 else tuple(range(R))

    def codegen(ctx, b, sig, args):
        w, xq, xd, xds, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 6))
        i, t = args[1], args[5]
        wrow = [w.row(b.add(i, _i64(r))) for r in range(R)]
        xrow = [xq.row(b.add(t, _i64(s))) for s in range(RT)]
        drow = [xd.row(b.add(t, _i64(s))) for s in range(RT)]
        srow = [xds.row(b.add(t, _i64(s))) for s in range(RT)]
        zero_i = _c(_v(I32, 8), [0] * 8)
        low16 = _c(_v(I8, 32), [15] * 32)
        four = _c(_v(I8, 32), [4] * 32)
        flip = _c(_v(I8, 32), [-128] * 32)

        def gather16(ps, off):
            v = ir.Constant(_v(I16, R), ir.Undefined)
            for lane, r in enumerate(order):
                v = b.insert_element(v, _load(b, ps[r], off, I16), _c(I32, lane))
            return _h2f(b, v)

        nxt = w.row(b.add(i, _i64(PF_GROUPS * R)))  # the rows PF_GROUPS groups ahead

        def body(bi, st):
            ps = [b.gep(row, [b.mul(bi, _i64(BB))], inbounds=True) for row in wrow]
            _prefetch_ahead(b, nxt, bi, R * BB)
            xoff = b.mul(bi, _i64(32))
            foff = b.mul(bi, _i64(4))
            dots = [[] for _ in range(RT)]
            if q4:
                xs = []
                for s in range(RT):
                    xl = _load(b, xrow[s], xoff, _v(I8, 16))
                    xh = _load(b, xrow[s], b.add(xoff, _i64(16)), _v(I8, 16))
                    xs.append((_pick(b, xl, list(range(16)) * 2),
                               _pick(b, xh, list(range(16)) * 2)))
                for r in range(0, R, 2):
                    raw = _pick(b, _load(b, ps[r], hdr, _v(I8, 16)), range(32),
                                _load(b, ps[r + 1], hdr, _v(I8, 16)))
                    lo = b.and_(raw, low16)
                    hi = b.lshr(raw, four)
                    for s in range(RT):
                        dots[s].append(_dot_acc(b, _dot_acc(b, zero_i, lo, xs[s][0]), hi,
                                                xs[s][1]))
            elif VNNI:  # (w + 128) . x - 128 sum(x): the second term starts each sum
                xs = [_load(b, xrow[s], xoff, _v(I8, 32)) for s in range(RT)]
                bias = [b.sub(zero_i, _dot_acc(b, zero_i, flip, x)) for x in xs]
                for r in range(R):
                    wu = b.xor(_load(b, ps[r], hdr, _v(I8, 32)), flip)
                    for s in range(RT):
                        dots[s].append(_dot_acc(b, bias[s], wu, xs[s]))
            else:
                xs = [_load(b, xrow[s], xoff, _v(I8, 32)) for s in range(RT)]
                for r in range(R):
                    dot = _signed_dot(b, _load(b, ps[r], hdr, _v(I8, 32)))
                    for s in range(RT):
                        dots[s].append(dot(xs[s]))
            dw = gather16(ps, 0)
            mw = gather16(ps, 2) if kind == "q4_1" else None
            new = []
            for s in range(RT):
                d = dots[s]
                while len(d) > 2:
                    d = [_hadd(b, d[k], d[k + 1]) for k in range(0, len(d), 2)]
                if q4:
                    tot = _hadd(b, d[0], d[1])  # lanes: rows in `order`
                else:  # d[0] lanes: rows 0-3 low half, 0-3 high half: add the halves
                    tot = b.add(_pick(b, d[0], (0, 1, 2, 3, 8, 9, 10, 11), d[1]),
                                _pick(b, d[0], (4, 5, 6, 7, 12, 13, 14, 15), d[1]))
                new.append(scale_block(b, kind, tot, drow[s], srow[s], foff, dw, mw, st[s]))
            return new

        group_blocks(b, b.sdiv(xq.cols, _i64(32)), RT, body, out, t, i, order)
        return ctx.get_dummy_value()

    return codegen


def _pair16(b, h0, h1):
    """Two f16 bit patterns (i16) -> <2 x f32>."""
    v = b.insert_element(ir.Constant(_v(I16, 2), ir.Undefined), h0, _c(I32, 0))
    v = b.insert_element(v, h1, _c(I32, 1))
    return _h2f(b, v)


def _last_block(b, kind, bi, wrow, xrow, drow, srow, st, RT):
    """Add one 32-column block (index bi, B = 32) to the scalar results st."""
    hdr, per_byte = BLOCK_BYTES[kind]
    BB = hdr + 32 // per_byte
    st = list(st)
    for r, row in enumerate(wrow):
        p = b.gep(row, [b.mul(bi, _i64(BB))], inbounds=True)
        dw = _f16(b, p, 0)
        wv = _load(b, p, 2, _v(I8, 32)) if kind == "q8_0" else _nibbles(b, p, hdr, 32)
        dot = _weight_dot(b, kind, wv)
        for s in range(RT):
            x = _load(b, xrow[s], b.mul(bi, _i64(32)), _v(I8, 32))
            dx = _load(b, drow[s], b.mul(bi, _i64(4)), F32)
            v = b.fmul(_hsum(b, b.sitofp(dot(x), _v(F32, 8))), b.fmul(dw, dx, flags=FAST),
                       flags=FAST)
            if kind != "q8_0":
                ds = _load(b, srow[s], b.mul(bi, _i64(4)), F32)
                fm = b.fmul(dw, _c(F32, -8.0), flags=FAST) if kind == "q4_0" else _f16(b, p, 2)
                v = b.fadd(v, b.fmul(fm, ds, flags=FAST), flags=FAST)
            st[r * RT + s] = b.fadd(st[r * RT + s], v, flags=FAST)
    return st


# ---------------------------------------------------------------------------------------
# float activations (precise mode) x quantized or float weights

NACC = 2  # accumulators per output: breaks the multiply-add dependency chain


def _dequant(b, kind, p, B, scaled=True):
    """Weight block at p as <16 x f32> chunks of dequantized values.

    scaled=False (q8_0, q4_0): the integer values q (q - 8 for q4_0), and the scale apart:
    returns (chunks, <16 x f32> scale).
    """
    hdr, _ = BLOCK_BYTES[kind]
    dwv = _splat(b, _f16(b, p, 0), 16)
    if kind == "q8_0":
        qs = [b.sitofp(_load(b, p, hdr + 16 * c, _v(I8, 16)), _v(F32, 16))
              for c in range(B // 16)]
    else:
        full = _nibbles(b, p, hdr, B)
        if kind == "q4_0":
            full = b.sub(full, _c(_v(I8, B), [8] * B))
        conv = b.sitofp if kind == "q4_0" else b.uitofp
        qs = [conv(_pick(b, full, range(16 * c, 16 * c + 16)), _v(F32, 16))
              for c in range(B // 16)]
    if not scaled:
        assert kind != "q4_1"
        return qs, dwv
    chunks = [b.fmul(q, dwv, flags=FAST) for q in qs]
    if kind == "q4_1":
        mv = _splat(b, _f16(b, p, 2), 16)
        chunks = [b.fadd(c, mv, flags=FAST) for c in chunks]
    return chunks


def _f32act_codegen(kind, B, RW, RT):
    """Tile for float activations. kind: q8_0/q4_0/q4_1 (block B) or f32/f16 (B unused)."""
    quantized = kind in BLOCK_BYTES
    if quantized:
        hdr, per_byte = BLOCK_BYTES[kind]
        BB, step = hdr + B // per_byte, B
    else:
        BB, step = (4 if kind == "f32" else 2) * 16, 16

    def codegen(ctx, b, sig, args):
        w, x, out = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 4))
        i, t = args[1], args[3]
        K = x.cols
        nb = b.sdiv(K, _i64(step))
        wrow = [w.row(b.add(i, _i64(r))) for r in range(RW)]
        xrow = [x.row(b.add(t, _i64(r))) for r in range(RT)]
        n = RW * RT
        zero16 = _c(_v(F32, 16), [0.0] * 16)

        # one token: sum q . x over the block first, then one multiply-add by the scale
        sum_first = RT == 1 and kind in ("q8_0", "q4_0")

        def body(bi, st):
            acc = list(st)
            for r in range(RW):
                p = b.gep(wrow[r], [b.mul(bi, _i64(BB))], inbounds=True)
                if sum_first:
                    qs, dwv = _dequant(b, kind, p, B, scaled=False)
                    xb = b.mul(bi, _i64(step * 4))
                    dot = None
                    for c, q in enumerate(qs):
                        xc = _load(b, xrow[0], b.add(xb, _i64(64 * c)), _v(F32, 16))
                        prod = b.fmul(q, xc, flags=FAST)
                        dot = prod if dot is None else b.fadd(dot, prod, flags=FAST)
                    j = r * NACC
                    acc[j] = b.fadd(acc[j], b.fmul(dot, dwv, flags=FAST), flags=FAST)
                    continue
                if quantized:
                    wf = _dequant(b, kind, p, B)
                elif kind == "f32":
                    wf = [_load(b, p, 0, _v(F32, 16))]
                else:
                    wf = [_h2f(b, _load(b, p, 0, _v(I16, 16)))]
                for s in range(RT):
                    xb = b.mul(bi, _i64(step * 4))
                    for c, wc in enumerate(wf):
                        xc = _load(b, xrow[s], b.add(xb, _i64(64 * c)), _v(F32, 16))
                        j = (r * RT + s) * NACC + c % NACC
                        acc[j] = b.fadd(acc[j], b.fmul(wc, xc, flags=FAST), flags=FAST)
            return acc

        unroll = 2 if (n == 1 and (not quantized or B == 32)) else 1
        states = _loop(b, nb, [zero16] * (n * NACC), body, unroll=unroll)
        final = states[0]
        for st in states[1:]:
            final = [b.fadd(u, v, flags=FAST) for u, v in zip(final, st, strict=True)]
        tails = [_c(F32, 0.0)] * n
        if not quantized:  # K % 16 leftover columns, scalar
            def tail(k, st):
                st = list(st)
                for r in range(RW):
                    if kind == "f32":
                        wk = _load(b, wrow[r], b.mul(k, _i64(4)), F32)
                    else:
                        wk = _h2f(b, _load(b, wrow[r], b.mul(k, _i64(2)), I16))
                    for s in range(RT):
                        xk = _load(b, xrow[s], b.mul(k, _i64(4)), F32)
                        j = r * RT + s
                        st[j] = b.fadd(st[j], b.fmul(wk, xk, flags=FAST), flags=FAST)
                return st
            tails = _for(b, b.mul(nb, _i64(16)), K, tails, tail)
        for r in range(RW):
            for s in range(RT):
                j = r * RT + s
                v = final[j * NACC]
                for a in range(1, NACC):
                    v = b.fadd(v, final[j * NACC + a], flags=FAST)
                res = b.fadd(_hsum(b, v), tails[j], flags=FAST)
                _store(b, out, b.add(t, _i64(s)), b.add(i, _i64(r)), res)
        return ctx.get_dummy_value()

    return codegen


def _dequant_row_codegen(kind, B):
    """Codegen of row(W, i, OUT, t): out[t, :] = dequantized row i of W (embedding)."""
    quantized = kind in BLOCK_BYTES
    if quantized:
        hdr, per_byte = BLOCK_BYTES[kind]
        BB, step = hdr + B // per_byte, B
    else:
        BB, step = (4 if kind == "f32" else 2) * 16, 16

    def codegen(ctx, b, sig, args):
        w, out = _Rows(ctx, b, sig.args[0], args[0]), _Rows(ctx, b, sig.args[2], args[2])
        wrow, orow = w.row(args[1]), out.row(args[3])
        D = out.cols

        def body(bi, st):
            p = b.gep(wrow, [b.mul(bi, _i64(BB))], inbounds=True)
            if quantized:
                chunks = _dequant(b, kind, p, B)
            elif kind == "f32":
                chunks = [_load(b, p, 0, _v(F32, 16))]
            else:
                chunks = [_h2f(b, _load(b, p, 0, _v(I16, 16)))]
            for c, v in enumerate(chunks):
                q = b.gep(orow, [b.add(b.mul(bi, _i64(step * 4)), _i64(64 * c))], inbounds=True)
                b.store(v, b.bitcast(q, v.type.as_pointer()), align=4)
            return st

        nb = b.sdiv(D, _i64(step))
        _for(b, _i64(0), nb, [], body)
        if not quantized:
            def tail(k, st):
                if kind == "f32":
                    v = _load(b, wrow, b.mul(k, _i64(4)), F32)
                else:
                    v = _h2f(b, _load(b, wrow, b.mul(k, _i64(2)), I16))
                q = b.gep(orow, [b.mul(k, _i64(4))], inbounds=True)
                b.store(v, b.bitcast(q, F32.as_pointer()), align=4)
                return st
            _for(b, b.mul(nb, _i64(16)), D, [], tail)
        return ctx.get_dummy_value()

    return codegen


def _quant_row_codegen(ctx, b, sig, args):
    """Row t of X (float32 [T, K]) -> int8 blocks of 32, as quant.quantize_activations_q8.

    d = amax / 127, inv = 1 / d (0 if d == 0), q = sign(v) floor(|v| + 0.5) with v = x inv,
    all in float32: bit for bit the reference when the calling kernel is `exact`.
    """
    x, xq, xd, xs, xds = (_Rows(ctx, b, sig.args[k], args[k]) for k in (0, 2, 3, 4, 5))
    t = args[1]
    xr, qr, dr, sr, dsr = (a.row(t) for a in (x, xq, xd, xs, xds))
    v32 = _v(F32, 32)
    fabs = _llvm_fn(b, "llvm.fabs.v32f32", v32, [v32])
    floor = _llvm_fn(b, "llvm.floor.v32f32", v32, [v32])
    copysign = _llvm_fn(b, "llvm.copysign.v32f32", v32, [v32, v32])
    vmax = _llvm_fn(b, "llvm.vector.reduce.fmax.v32f32", F32, [v32])
    vadd = _llvm_fn(b, "llvm.vector.reduce.add.v32i32", I32, [_v(I32, 32)])

    def body(bi, st):
        v = _load(b, xr, b.mul(bi, _i64(128)), v32)
        amax = b.call(vmax, [b.call(fabs, [v])], fastmath=("nnan", "nsz"))  # order-free: exact
        d = b.fdiv(amax, _c(F32, 127.0))
        nz = b.fcmp_ordered("!=", d, _c(F32, 0.0))
        inv = b.select(nz, b.fdiv(_c(F32, 1.0), d), _c(F32, 0.0))
        sv = b.fmul(v, _splat(b, inv, 32))
        r = b.call(floor, [b.fadd(b.call(fabs, [sv]), _c(v32, [0.5] * 32))])
        q = b.fptosi(b.call(copysign, [r, sv]), _v(I8, 32))
        p = b.gep(qr, [b.mul(bi, _i64(32))], inbounds=True)
        b.store(q, b.bitcast(p, q.type.as_pointer()), align=1)
        total = b.call(vadd, [b.sext(q, _v(I32, 32))])
        off = b.mul(bi, _i64(4))
        for row, val in ((dr, d), (sr, total), (dsr, b.fmul(d, b.sitofp(total, F32)))):
            p = b.gep(row, [off], inbounds=True)
            b.store(val, b.bitcast(p, val.type.as_pointer()), align=4)
        return st

    _for(b, _i64(0), b.sdiv(x.cols, _i64(32)), [], body)
    return ctx.get_dummy_value()


@intrinsic
def quant_row(typingctx, X, t, XQ, XD, XS, XDS):
    """quant_row(x, t, xq, xd, xs, xds): quantize row t of x into row t of the buffers."""
    want = ((X, types.float32), (XQ, types.int8), (XD, types.float32), (XS, types.int32),
            (XDS, types.float32))
    for a, dt in want:
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == dt):
            raise TypingError(f"quant_row: expected a 2-D {dt} array, got {a}")
    return types.none(X, types.int64, XQ, XD, XS, XDS), _quant_row_codegen


# ---------------------------------------------------------------------------------------
# The intrinsics the kernels call. `block` (32, 64 or 128) is a runtime argument: each
# intrinsic holds one loop per block size behind a switch (f32/f16 ignore it).
#   tile_<type>_<RW>x<RT>(W, block, i, xq, xd, xds, t, out)   int8 activations
#   ftile_<type>_<RW>x<RT>(W, block, i, x, t, out)            float activations
#   row_<type>(W, block, i, out, t)                           out[t] = row i (embedding)
# Each writes out[t + s, i + r] for r < RW, s < RT and reads nothing else of out.

TILES_INT8 = ((1, 1), (1, 4), (4, 1), (GROUP, 1))  # prefill's row groups: panel.py
TILES_FLOAT = ((1, 1), (1, 4))
_WEIGHT_DTYPE = {"f32": types.float32, "f16": types.uint16}  # quantized: uint8


def _by_block(make):
    """A codegen taking `block` as argument 1 and running make(B)'s codegen for it."""
    gens = {B: make(B) for B in BLOCKS}

    def codegen(ctx, b, sig, args):
        rest = [a for k, a in enumerate(args) if k != 1]
        rsig = types.none(*[a for k, a in enumerate(sig.args) if k != 1])
        done = b.append_basic_block("block_done")
        cases = {B: b.append_basic_block(f"block{B}") for B in BLOCKS}
        switch = b.switch(args[1], cases[BLOCKS[-1]])  # validated by the caller
        for B in BLOCKS[:-1]:
            switch.add_case(ir.Constant(args[1].type, B), cases[B])
        for B, bb in cases.items():
            b.position_at_end(bb)
            gens[B](ctx, b, rsig, rest)
            b.branch(done)
        b.position_at_end(done)
        return ctx.get_dummy_value()

    return codegen


def _drop_block(codegen):
    def drop(ctx, b, sig, args):
        rest = [a for k, a in enumerate(args) if k != 1]
        return codegen(ctx, b, types.none(*[a for k, a in enumerate(sig.args) if k != 1]), rest)
    return drop


def _typed(name, codegen, arrays, ints):
    """An intrinsic `name`: args are 2-D arrays of the given dtypes or integers (by position)."""
    def check(args):
        sig = []
        for k, a in enumerate(args):
            if k in ints:
                if not isinstance(a, types.Integer):
                    raise TypingError(f"{name}: argument {k} must be an integer, got {a}")
                sig.append(types.int64)
            else:
                dt = arrays[k]
                if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == dt):
                    raise TypingError(f"{name}: argument {k} must be a 2-D {dt} array, got {a}")
                sig.append(a)
        return types.none(*sig), codegen

    # numba's @intrinsic needs a fixed parameter list
    nargs = len(arrays) + len(ints)
    if nargs == 10:
        def typer(typingctx, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
            return check((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9))
    elif nargs == 8:
        def typer(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
            return check((a0, a1, a2, a3, a4, a5, a6, a7))
    elif nargs == 6:
        def typer(typingctx, a0, a1, a2, a3, a4, a5):
            return check((a0, a1, a2, a3, a4, a5))
    else:
        assert nargs == 5, nargs

        def typer(typingctx, a0, a1, a2, a3, a4):
            return check((a0, a1, a2, a3, a4))
    typer.__name__ = typer.__qualname__ = name
    return intrinsic(typer)


def _stacked(kind, B, RT):
    """A GROUP x RT tile as GROUP / 2 tiles of 2 x RT (block sizes 64 and 128)."""
    pair = _q8act_codegen(kind, B, 2, RT)

    def codegen(ctx, b, sig, args):
        for r in range(0, GROUP, 2):
            pair(ctx, b, sig, [*args[:1], b.add(args[1], _i64(r)), *args[2:]])
        return ctx.get_dummy_value()

    return codegen


def _make_tile(kind, RW, RT):
    name = f"tile_{kind}_{RW}x{RT}"
    def make(B):
        # decode's one-row tile: 256-bit blocks measured faster for q8_0 and q4_0 (79 vs 92,
        # 87 vs 97 us at 2560x960, hot cache), 64-column units for q4_1 (96 vs 100 us)
        # q8_0: 4 rows (shared activation work, prefetched: 25 vs 36 us at 1536x576, hot,
        # 0.78 vs 1.13 ms at 49152x576)
        if B == 32 and RT == 1 and (RW == 1 and kind != "q4_1" or RW == 4 and kind == "q8_0"):
            return _q8act_row_codegen(kind, RW)
        if RW == GROUP:
            return _group_codegen(kind, RT) if B == 32 else _stacked(kind, B, RT)
        return _q8act_codegen(kind, B, RW, RT)

    codegen = _by_block(make)
    arrays = {0: types.uint8, 3: types.int8, 4: types.float32, 5: types.float32,
              7: types.float32}
    return name, _typed(name, codegen, arrays, ints=(1, 2, 6))


def _make_ftile(kind, RW, RT):
    name = f"ftile_{kind}_{RW}x{RT}"
    if kind in BLOCK_BYTES:
        codegen = _by_block(lambda B: _f32act_codegen(kind, B, RW, RT))
    else:
        codegen = _drop_block(_f32act_codegen(kind, 0, RW, RT))
    arrays = {0: _WEIGHT_DTYPE.get(kind, types.uint8), 3: types.float32, 5: types.float32}
    return name, _typed(name, codegen, arrays, ints=(1, 2, 4))


def _make_row(kind):
    name = f"row_{kind}"
    if kind in BLOCK_BYTES:
        codegen = _by_block(lambda B: _dequant_row_codegen(kind, B))
    else:
        codegen = _drop_block(_dequant_row_codegen(kind, 0))
    arrays = {0: _WEIGHT_DTYPE.get(kind, types.uint8), 3: types.float32}
    return name, _typed(name, codegen, arrays, ints=(1, 2, 4))


for _kind in KINDS + ("f32", "f16"):
    for _rw, _rt in TILES_INT8 if _kind in KINDS else ():
        _n, _f = _make_tile(_kind, _rw, _rt)
        globals()[_n] = _f
    for _rw, _rt in TILES_FLOAT:
        _n, _f = _make_ftile(_kind, _rw, _rt)
        globals()[_n] = _f
    _n, _f = _make_row(_kind)
    globals()[_n] = _f
