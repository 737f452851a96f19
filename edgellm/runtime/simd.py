"""Which SIMD path the kernels take on this CPU, and the CPU features behind the choice.

Two paths, chosen once per process when the kernels are imported (`SIMD_PATH`):
  "vnni"      `llvm.x86.avx512.vpdpbusd.512` (u8 x s8 -> i32, 4 products per lane) on 64
              columns at a time: q4 weights are unsigned nibbles times signed activations
              with the -8 / +m offsets folded in afterwards; q8_0 uses |w| . sign(w) x.
              Chosen only where llvmlite reports avx512vnni and avx512vl for the host and
              numba compiles for the host CPU (not NUMBA_CPU_NAME=generic).
  "portable"  the same dot as sext/zext, mul and pairwise adds in generic vector IR: x86
              lowers it to vpmaddwd, aarch64 to its own multiply-adds. Forced by
              select_path(portable=True); the process's choice is numba_setup.PORTABLE
              (EDGELLM_PORTABLE=1 or EDGELLM_ISA=portable|avx2, read there and nowhere else).
EDGELLM_ISA=avx2 (numba_setup.ISA) also has numba compile for an AVX2 CPU without AVX-512
(Haswell): the portable path as an AVX2-only machine runs it, instruction for instruction;
`check_target` refuses it if numba had already compiled for this CPU before it was read.
Float work (scales, float activations, f32/f16 weights) is generic vector IR on both paths.
On the vnni path, `AMX` says whether prefill's panels also run on Intel AMX tiles (amx.py):
the host and the compile target have AMX-INT8, the operating system lets the process use
the tile state (`amx_permitted`), and EDGELLM_NO_AMX is not set (numba_setup.NO_AMX).
The generated IR reads VNNI and NATIVE_F16 (ir.py), and the kernel cache tag names the
path (jit.py), so the two never share compiled code.
"""

from __future__ import annotations

# isort: off
from . import numba_setup  # numba's environment: must come before numba
# isort: on
import ctypes
import platform

import llvmlite.binding as llb
from numba.core import config

from ..errors import ArgumentError

__all__ = ["AMX", "GFNI", "HALF_PUMPED_512", "ISA", "NATIVE_F16", "SIMD_PATH", "VNNI", "X86",
           "amx_permitted", "check_target", "native_f16", "select_path", "target_cpu",
           "target_features"]
ISA = numba_setup.ISA  # native, portable or avx2 (EDGELLM_ISA)
X86 = platform.machine().lower() in ("x86_64", "amd64")  # a 64-bit x86 host


def target_features() -> set[str]:
    """CPU features numba compiles for: NUMBA_CPU_FEATURES if set ("" for
    NUMBA_CPU_NAME=generic), else the host's (as numba.core.codegen does)."""
    if config.CPU_FEATURES is not None:
        return {f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+")}
    from numba.core.codegen import get_host_cpu_features

    return {f[1:] for f in get_host_cpu_features().split(",") if f.startswith("+")}


def target_cpu() -> str:
    """The CPU numba compiles for: NUMBA_CPU_NAME if set, else the host's (LLVM's name)."""
    return (config.CPU_NAME or "").strip().lower() or llb.get_host_cpu_name()


def select_path(portable: bool = False) -> str:
    """"vnni" where the host and numba's compile target both have AVX512-VNNI (and VL) and
    `portable` is not asked for, else "portable"."""
    if portable:
        return "portable"
    if target_cpu() == "generic":
        return "portable"
    host = llb.get_host_cpu_features()
    need = ("avx512vnni", "avx512vl")
    if all(host.get(f) for f in need) and all(f in target_features() for f in need):
        return "vnni"
    return "portable"


def native_f16() -> bool:
    """Does the compile target convert float16 in hardware (x86: F16C; aarch64: always)?"""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return "f16c" in target_features()
    return machine in ("aarch64", "arm64")


def amx_permitted() -> bool:
    """Ask Linux for the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA));
    without it the first tile instruction faults. Idempotent; False elsewhere or if refused."""
    if platform.system() != "Linux" or not X86:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, REQ_XCOMP_PERM, XTILEDATA
    except (OSError, AttributeError):
        return False


def _amx(vnni: bool) -> bool:
    need = ("amx-int8", "amx-tile")
    if not vnni or numba_setup.NO_AMX:
        return False
    host = llb.get_host_cpu_features()
    if not all(host.get(f) for f in need) or not all(f in target_features() for f in need):
        return False
    return amx_permitted()


def check_target() -> None:
    """Under EDGELLM_ISA=avx2, ArgumentError if numba's code generator already exists and
    emits AVX-512 (numba compiled something before numba_setup set its CPU: set EDGELLM_ISA
    in the environment before Python starts, not in a running process)."""
    from numba.core.registry import cpu_target

    ctx = cpu_target.__dict__.get("_toplevel_target_context")  # made at the first compile
    if ISA == "avx2" and ctx is not None and "+avx512f" in ctx.codegen().magic_tuple()[2]:
        raise ArgumentError("EDGELLM_ISA=avx2 was read after numba had compiled for this "
                            "CPU: set it before Python starts")


check_target()
SIMD_PATH = select_path(portable=numba_setup.PORTABLE)
VNNI = SIMD_PATH == "vnni"
if VNNI:  # ir.vpdpwssd's inline assembly needs LLVM's x86 assembly parser (numba sets up
    llb.initialize_native_asmparser()  # the target and printer only)
AMX = _amx(VNNI)
# on the vnni path, gf2p8affineqb (one byte-wise bit matrix a 64-bit lane: a shift and mask
# of every byte in one operation) where the compile target has GFNI (Ice Lake, Zen 4 on)
GFNI = VNNI and "gfni" in target_features()
# on the vnni path, a CPU that runs each 512-bit instruction as two 256-bit halves (Zen 4):
# the tiles' instruction count, not memory, bounds one core's decode there (kernels/x16.py)
HALF_PUMPED_512 = VNNI and target_cpu() == "znver4"
NATIVE_F16 = native_f16()  # else f16 scales are converted in integer IR (ir._h2f)
