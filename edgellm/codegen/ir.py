"""LLVM IR helpers for the code generators, and the plumbing that makes a codegen an intrinsic.

Plain Numba loops do not vectorize int8 block dot products well (kernels.md), so the loop
over one weight row's blocks is written as IR (codegen_int8.py, codegen_float.py,
panel.py), emitted through `numba.extending.intrinsic`. Weights are read as ggml's blocks
as stored (quant.py): nothing is repacked or copied. The helpers here build that IR: vector
types and constants, unaligned loads, f16 conversion, shuffles and sums, the int8 dot
products of the SIMD path (simd.py), loops. `_by_block` and `_typed` turn a codegen into a
typed intrinsic taking the block size (32, 64 or 128) as a runtime argument.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..modelfile import quant
from ..runtime.simd import NATIVE_F16, VNNI

BLOCKS = quant.BLOCK_SIZES
# IR helpers
I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32 = ir.HalfType(), ir.FloatType()
BYTES = I8.as_pointer()
FAST = ("fast",)
# every fast-math flag but reassoc: float operations happen in the order written, so a tile
# of several tokens gives each the one-token tile's results whatever LLVM does around it
ORDERED = ("nnan", "ninf", "nsz", "arcp", "contract", "afn")


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


def _splat_f16(b, base, off, n):
    """<n x f32> of the f16 at byte offset off of base, broadcast as bits first
    (vpbroadcastw + vcvtph2ps on x86: no scalar conversion and broadcast)."""
    h = _load(b, base, off, I16)
    v = b.insert_element(ir.Constant(_v(I16, n), ir.Undefined), h, _c(I32, 0))
    return _h2f(b, b.shuffle_vector(v, v, _c(_v(I32, n), [0] * n)))


def _splat(b, x, n):
    v = b.insert_element(ir.Constant(_v(x.type, n), ir.Undefined), x, _c(I32, 0))
    return b.shuffle_vector(v, v, _c(_v(I32, n), [0] * n))


def _pick(b, v, idx, other=None):
    return b.shuffle_vector(v, v if other is None else other, _c(_v(I32, len(idx)), list(idx)))


def _hsum(b, v, flags=FAST):
    """Sum of a float vector's lanes (halving tree)."""
    n = v.type.count
    while n > 1:
        n //= 2
        v = b.fadd(_pick(b, v, range(n)), _pick(b, v, range(n, 2 * n)), flags=flags)
    return b.extract_element(v, _c(I32, 0))


def _pair_dot(b, w, x):
    """<n x i16> w . <n x i8|i16> x, sign-extended products summed in pairs: <n/2 x i32>,
    lane j = w[2j] x[2j] + w[2j+1] x[2j+1] (the generic IR of vpmaddwd)."""
    n = w.type.count
    p = b.mul(b.sext(w, _v(I32, n)), b.sext(x, _v(I32, n)))
    return b.add(_pick(b, p, range(0, n, 2)), _pick(b, p, range(1, n, 2)))


def _finite_inverse(b, d):
    """1 / d for a float scale d, 0 where that is not finite (d 0, or a subnormal whose
    inverse overflows), as quant._inverse: else 0 * inf makes NaNs, whose conversion to int
    is undefined."""
    r = b.fdiv(_c(F32, 1.0), d)
    return b.select(b.fcmp_ordered("<", r, _c(F32, float("inf"))), r, _c(F32, 0.0))


def _pairsum(b, p):
    """<n x i32> products -> <n/4 x i32>: lane j sums products 4j..4j+3 (vpdpbusd's grouping)."""
    n = p.type.count
    p = b.add(_pick(b, p, range(0, n, 2)), _pick(b, p, range(1, n, 2)))
    return b.add(_pick(b, p, range(0, n // 2, 2)), _pick(b, p, range(1, n // 2, 2)))


def _vnni(x) -> bool:
    """Does the dot of activation vector x run on vpdpbusd? Only int8 activations do: int16
    ones (the default decode path) take the generic IR, which x86 lowers to vpmaddwd."""
    return VNNI and x.type.element == I8


def _dot_us(b, u8, s8):
    """<n/4 x i32> partial sums of unsigned u8 x signed s8 or s16 (n = 32 or 64 lanes)."""
    n = u8.type.count
    if _vnni(s8):
        vi = _v(I32, n // 4)
        fn = _llvm_fn(b, f"llvm.x86.avx512.vpdpbusd.{8 * n}", vi, [vi] * 3)
        return b.call(fn, [_c(vi, [0] * (n // 4)), b.bitcast(u8, vi), b.bitcast(s8, vi)])
    return _pairsum(b, b.mul(b.zext(u8, _v(I32, n)), b.sext(s8, _v(I32, n))))


def _signed_dot(b, w):
    """dot(x) for signed int8 weights w: VNNI needs |w| . sign(w) x (u8 x s8); int16 x and
    the portable path multiply the sign-extended lanes."""
    n = w.type.count
    if not VNNI:
        return lambda x: _pairsum(b, b.mul(b.sext(w, _v(I32, n)), b.sext(x, _v(I32, n))))
    zero = _c(w.type, [0] * w.type.count)
    neg = b.icmp_signed("<", w, zero)
    absw = b.select(neg, b.sub(zero, w), w)

    def dot(x):
        if not _vnni(x):
            return _pairsum(b, b.mul(b.sext(w, _v(I32, n)), b.sext(x, _v(I32, n))))
        return _dot_us(b, absw, b.select(neg, b.sub(zero, x), x))
    return dot


def _signed_dot_halves(b, w):
    """dot(x) -> <8 x i32> for 32 signed int8 weights w and 32 int8/int16 activations x,
    where lane j sums products 2j, 2j+1, 16+2j, 16+2j+1: two vpmaddwd and one vpaddd on
    AVX2 (the 4j..4j+3 grouping of _pairsum costs a vphaddd and a vpermq more). For tiles
    whose lanes all belong to one row (the sum is the same integer either way)."""
    n = w.type.count
    assert n == 32

    def dot(x):
        p = b.mul(b.sext(w, _v(I32, n)), b.sext(x, _v(I32, n)))
        p = b.add(_pick(b, p, range(0, n, 2)), _pick(b, p, range(1, n, 2)))
        return b.add(_pick(b, p, range(8)), _pick(b, p, range(8, 16)))
    return dot


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


def _store_vec(b, base, off, value):
    """Unaligned store of the vector `value` at byte offset `off` (i64 value) of i8* base."""
    p = b.gep(base, [off], inbounds=True)
    b.store(value, b.bitcast(p, value.type.as_pointer()), align=1)


def _prefetch_ahead(b, nxt, bi, nbytes):
    """Hint the nbytes at nxt + bi * nbytes into L2: rows read side by side are as many
    streams, which the hardware prefetcher follows badly, so a tile fetches the rows after
    it linearly, as much per block as it consumes (a hint: never faults, also past the end
    of the matrix). Into L2, not L1: a weight stream from DRAM is bound by the misses one
    core keeps in flight, and L1's few fill buffers also serve the tiles' own loads (L2
    measured faster than L1 or non-temporal hints for a DRAM-bound decode)."""
    ahead = b.gep(nxt, [b.mul(bi, _i64(nbytes))])
    for c in range(0, nbytes, 64):
        _prefetch(b, b.gep(ahead, [_i64(c)]), level=2)


def _prefetch(b, ptr, level=1):
    """Hint the cache line at ptr (any pointer type) into L1 (level 1) or L2 (level 2) for
    reading: a hint, it never faults, so ptr may point past its array's end."""
    if ptr.type != BYTES:
        ptr = b.bitcast(ptr, BYTES)
    pf = _llvm_fn(b, "llvm.prefetch.p0", ir.VoidType(), [BYTES, I32, I32, I32])
    b.call(pf, [ptr, _c(I32, 0), _c(I32, 3 if level == 1 else 2), _c(I32, 1)])



def _dot_acc(b, acc, u8, s8):
    """acc + the <n/4 x i32> partial sums of unsigned u8 x signed s8 or s16 (32 lanes)."""
    n = u8.type.count
    if _vnni(s8):
        vi = _v(I32, n // 4)
        fn = _llvm_fn(b, f"llvm.x86.avx512.vpdpbusd.{8 * n}", vi, [vi] * 3)
        return b.call(fn, [acc, b.bitcast(u8, vi), b.bitcast(s8, vi)])
    return b.add(acc, _pairsum(b, b.mul(b.zext(u8, _v(I32, n)), b.sext(s8, _v(I32, n)))))



def vpdpwssd(b, acc, w, x):
    """acc + w . x as i16 pairs (<16 x i32> each), one vpdpwssd whatever LLVM's tuning: its
    machine combiner splits chains of the intrinsic into vpmaddwd + vpaddd (two operations,
    and no broadcast folded into them) for the host model this KVM guest reports
    (rocketlake), which made the interleaved tiles measurably slower. Inline assembly, which LLVM does not rewrite; VNNI only. On a zero
    acc the intrinsic, which LLVM makes one vpmaddwd."""
    v16i = _v(I32, 16)
    if isinstance(acc, ir.Constant) and str(acc) == str(_c(v16i, [0] * 16)):
        fn = _llvm_fn(b, "llvm.x86.avx512.vpdpwssd.512", v16i, [v16i] * 3)
        return b.call(fn, [acc, w, x])
    return b.asm(ir.FunctionType(v16i, [v16i] * 3), "vpdpwssd $3, $2, $0", "=v,0,v,v",
                 [acc, w, x], False)


def vpdpwssd_bcast(b, acc, w, base, disp: int):
    """acc + w . (the i16 pair at byte base + disp, broadcast to every lane), with the
    broadcast in the instruction's memory operand ({1to16}): one fused micro-op where a
    separate vbroadcastss and vpdpwssd are two, which the 4-token interleaved tiles were
    bound by (inline assembly, as vpdpwssd). base: an i64 address; the memory must not
    change while the kernel runs (the asm is not marked as reading it). VNNI only."""
    v16i = _v(I32, 16)
    return b.asm(ir.FunctionType(v16i, [v16i, v16i, I64, I64]),
                 "vpdpwssd ${4:c}($3){1to16}, $2, $0", "=v,0,v,r,i",
                 [acc, w, base, _i64(disp)], False)


def vpdpbusd_bcast(b, acc, w, base, disp: int):
    """acc + w . x as u8 quadruples (<16 x i32> each) times the i8 quadruple x at byte
    base + disp, broadcast to every lane from the memory operand ({1to16}): vpdpwssd_bcast's
    int8 twin (four products a lane where it has two), under the same conditions."""
    v16i = _v(I32, 16)
    return b.asm(ir.FunctionType(v16i, [v16i, v16i, I64, I64]),
                 "vpdpbusd ${4:c}($3){1to16}, $2, $0", "=v,0,v,r,i",
                 [acc, w, base, _i64(disp)], False)


def _hadd(b, u, v):
    """Horizontal pair sums of two <8 x i32> within 128-bit halves (x86 vphaddd)."""
    lo = _pick(b, u, (0, 2, 8, 10, 4, 6, 12, 14), v)
    hi = _pick(b, u, (1, 3, 9, 11, 5, 7, 13, 15), v)
    return b.add(lo, hi)



def _pair16(b, h0, h1):
    """Two f16 bit patterns (i16) -> <2 x f32>."""
    v = b.insert_element(ir.Constant(_v(I16, 2), ir.Undefined), h0, _c(I32, 0))
    v = b.insert_element(v, h1, _c(I32, 1))
    return _h2f(b, v)



# ---------------------------------------------------------------------------------------
# codegen -> intrinsic. `block` (32, 64 or 128) is a runtime argument: each intrinsic
# holds one loop per block size behind a switch (float types ignore it).


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
                dt = arrays[k]  # a dtype, or a tuple of the dtypes the codegen takes
                ok = dt if isinstance(dt, tuple) else (dt,)
                if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype in ok):
                    raise TypingError(f"{name}: argument {k} must be a 2-D {dt} array, got {a}")
                sig.append(a)
        return types.none(*sig), codegen

    # numba's @intrinsic needs a fixed parameter list
    nargs = len(arrays) + len(ints)
    if nargs == 10:
        def typer(typingctx, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
            return check((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9))
    elif nargs == 9:
        def typer(typingctx, a0, a1, a2, a3, a4, a5, a6, a7, a8):
            return check((a0, a1, a2, a3, a4, a5, a6, a7, a8))
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

