"""The kernel decorator, `@kernel`, and the cache tag its compiled code is filed under.

Caching (numba#1833): numba's cache key for a kernel covers only its own source file, not
intrinsics or jitted functions it calls from other modules, nor the SIMD path. Kernels
are therefore defined with `@kernel`, which caches them in a subdirectory of
NUMBA_CACHE_DIR named by CACHE_TAG: KERNEL_VERSION, SIMD_PATH (simd.py) and a hash of the
kernel sources (`_SOURCES`: the IR helpers and code generators, the intrinsic registries,
the kernel modules built on them, sync.py (the decode step's barrier), the fused steps
(decode_step.py, batch_step.py: batch_step's cached step holds decode_step's code) and the
helpers they inline (norms.py, rope.py, moe.py), and quant.py, whose table gives the block
layouts the generators emit). Editing any of them or switching path never loads a stale
kernel. A kernel elsewhere that calls these intrinsics or kernels (a
fused decode step, say) should be defined with `@kernel` too, so that it is cached under
the same tag; bump KERNEL_VERSION when a change the hash does not see must invalidate
cached kernels (a global LLVM option, a helper module). Old tag directories are not deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import numba
from numba.core import config

from .simd import NATIVE_F16, SIMD_PATH

__all__ = ["CACHE_TAG", "KERNEL_VERSION", "OPTIONS", "kernel"]

KERNEL_VERSION = 2
OPTIONS = dict(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, cache=True)

# The kernel sources the tag covers, relative to this directory.
_SOURCES = ("simd.py", "jit.py", "ir.py", "codegen_int8.py", "codegen_float.py", "tiles.py",
            "panel.py", "act_quant.py", "matvec.py", "matmul.py", "sync.py", "fastexp.py",
            "activations.py", "attention.py", "dots.py", "kquant.py", "panel_gemm.py",
            "encoder.py", "codegen_kquant.py", "kquant_int.py", "kv_store.py",
            "norms.py", "rope.py", "moe.py", "decode_step.py", "batch_step.py",
            os.path.join("..", "quant.py"), os.path.join("..", "quant_k.py"))


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
