"""exp32 (kernels/fastexp.py) against the C library's expf, bit for bit where it can be.

exp32 replaces np.exp in the SwiGLU and softmax kernels on the promise that it changes no
result (it is inlined into callers compiled without fastmath): on glibc with FMA (x86-64)
or aarch64 its bits must equal libm's for every float32. Elsewhere (another libm, or code
built for a CPU without FMA while glibc picks its FMA variant at run time) it must stay
within one ulp.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from edgellm.kernels.fastexp import exp32
from edgellm.runtime import simd


@intrinsic
def _f32_from_bits(typingctx, bits):
    def codegen(ctx, b, sig, args):
        return b.bitcast(b.trunc(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(types.int64), codegen


@intrinsic
def _bits_of_f32(typingctx, x):
    def codegen(ctx, b, sig, args):
        return b.sext(b.bitcast(args[0], ir.IntType(32)), ir.IntType(64))
    return types.int64(types.float32), codegen


@njit(fastmath=False)
def _libm_exp(x):
    return np.exp(x)  # numba calls the C library's expf


@njit(parallel=True, fastmath=False)  # an exact caller, as exp32's callers must be
def _scan(start, stop, step, worst):
    """Counts inputs (bit patterns start, start+step, .. < stop) where exp32 and libm's
    expf differ; worst[0] = largest difference in ulps, worst[1] = a pattern with it."""
    n = (stop - start + step - 1) // step
    bad = 0
    for j in prange(n):
        bits = start + j * step
        x = _f32_from_bits(bits)
        a, b = _bits_of_f32(exp32(x)), _bits_of_f32(_libm_exp(x))
        a_nan = (a & 0x7FFFFFFF) > 0x7F800000
        b_nan = (b & 0x7FFFFFFF) > 0x7F800000
        if a != b and not (a_nan and b_nan):
            bad += 1
            d = abs(a - b)
            if d > worst[0]:
                worst[0] = d
                worst[1] = bits
    return bad


def _exact_expected() -> bool:
    if platform.libc_ver()[0] != "glibc":
        return False
    machine = platform.machine().lower()
    return machine in ("aarch64", "arm64") or "fma" in simd.target_features()


# every 7th float32 bit pattern (7 is odd: all low-bit patterns occur), then dense windows
# around the edges of the formula's range and the special values
RANGES = [
    (0, 2**32, 7),
    (0x42B17000, 0x42B18000, 1),  # ~88.72: the last finite results
    (0xC2CFF000, 0xC2D00000, 1),  # ~-103.97: the last nonzero results
    (0xC2AEA000, 0xC2AEB000, 1),  # ~-87.33: results turn subnormal
    (0x00000000, 0x00001000, 1),  # +0 and the smallest subnormals
    (0x80000000, 0x80001000, 1),
    (0x7F7FF000, 0x7F801000, 1),  # the largest floats, inf, NaNs
    (0xFF7FF000, 0xFF801000, 1),
    (0x3F7FF000, 0x3F801000, 1),  # around 1
]


@pytest.mark.parametrize("start,stop,step", RANGES)
def test_exp32_matches_libm(start, stop, step):
    worst = np.zeros(2, np.int64)
    bad = _scan(start, stop, step, worst)
    if _exact_expected():
        assert bad == 0, (f"{bad} inputs differ from libm's expf, up to {worst[0]} ulp at "
                          f"bits {worst[1]:#010x}")
    else:
        assert worst[0] <= 1, f"{worst[0]} ulp from libm's expf at bits {worst[1]:#010x}"


def test_exp32_specials():
    for x, want in ((0.0, 1.0), (-0.0, 1.0), (np.inf, np.inf), (-np.inf, 0.0), (89.0, np.inf),
                    (-105.0, 0.0), (1.0, np.float32(np.e))):
        assert exp32(np.float32(x)) == np.float32(want), x
    assert np.isnan(exp32(np.float32(np.nan)))


def test_exp_shift_is_libm_exp_and_masks():
    from edgellm.kernels.fastexp import MASKED, exp_shift

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 20).astype(np.float32)
    x[::7] = MASKED
    x[1::7] = rng.uniform(-110, -80, x[1::7].shape)  # exps near and below float32's normals
    e = np.array([_libm_exp(v) for v in x - np.float32(3.5)], np.float32)
    normal = e >= np.finfo(np.float32).tiny  # subnormal numerators are 0 (see exp_shift)
    assert (~normal & (x > MASKED)).sum() > 30 and (normal[1::7]).sum() > 10
    want = np.where((x > MASKED) & normal, e, 0).astype(np.float32)
    exp_shift(x, 997, np.float32(3.5))  # the last 3 stay as they were
    np.testing.assert_array_equal(x[:997].view(np.uint32), want[:997].view(np.uint32))


def test_exp_shift_threshold_is_the_normal_boundary():
    from edgellm.kernels.fastexp import NORMAL_FROM

    tiny = np.finfo(np.float32).tiny
    assert exp32(NORMAL_FROM) >= tiny
    assert exp32(np.nextafter(NORMAL_FROM, np.float32(-np.inf))) < tiny
