"""The kernel decorator, `@kernel`, and the cache tag its compiled code is filed under.

Caching (numba#1833): numba's cache key for a kernel covers only its own source file, not
intrinsics or jitted functions it calls from other modules, nor the SIMD path. Kernels
are therefore defined with `@kernel`, which caches them in a subdirectory of
NUMBA_CACHE_DIR named by CACHE_TAG: KERNEL_VERSION, SIMD_PATH (simd.py) and a hash of the
kernel sources (`_sources`: every module of this package, whose kernels call each other's
intrinsics and inline each other's helpers (batch_step's cached step holds decode_step's
code), and quant.py / quant_k.py / layout.py, whose tables give the block layouts the
generators emit).
Editing any of them or switching path never loads a stale kernel; a new kernel module is
covered without being listed (a hand-kept list once missed the fused steps). A kernel
elsewhere that calls these intrinsics or kernels (a
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

from ..runtime import numba_loading
from ..runtime.simd import AMX, NATIVE_F16, SIMD_PATH

numba_loading.install()  # cache hits load lighter (numba_loading.py)

__all__ = ["CACHE_TAG", "GLUE", "KERNEL_VERSION", "OPTIONS", "is_cached", "kernel"]

KERNEL_VERSION = 3
OPTIONS = dict(fastmath=True, boundscheck=False, error_model="numpy", nogil=True, cache=True)
# the glue family.py makes while numba types a kernel (dispatch chains): compiled into that
# kernel, cached with it, not on its own (it closes over functions: family.py)
GLUE = dict(OPTIONS, cache=False)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # edgellm/
_FOLDERS = ("kernels", "codegen", "step")
_FILES = (os.path.join("runtime", "simd.py"), os.path.join("modelfile", "quant.py"),
          os.path.join("modelfile", "quant_k.py"), os.path.join("modelfile", "layout.py"))


def _sources() -> list[str]:
    """The files the tag hashes (relative to edgellm/, sorted within each folder): every
    module of the folders whose kernels call each other's intrinsics and inline each
    other's helpers (kernels/, codegen/, step/), the CPU path (runtime/simd.py) and the
    quant tables (modelfile/quant.py, quant_k.py) and the x16 layout (layout.py), which give
    the block layouts the generators emit."""
    names = []
    for folder in _FOLDERS:
        try:
            names += sorted(os.path.join(folder, n) for n in os.listdir(os.path.join(_ROOT, folder))
                            if n.endswith(".py"))
        except OSError:  # e.g. a zipped install: the tag falls back on KERNEL_VERSION alone
            pass
    return [*names, *_FILES]


def _sources_hash() -> str:
    h = hashlib.sha256()
    for name in _sources():
        try:
            with open(os.path.join(_ROOT, name), "rb") as f:
                h.update(f.read())
        except OSError:  # e.g. a zipped install: fall back on KERNEL_VERSION alone
            h.update(name.encode())
    return h.hexdigest()[:10]


CACHE_TAG = (f"k{KERNEL_VERSION}-{SIMD_PATH}{'-amx' if AMX else ''}"
             f"{'' if NATIVE_F16 else '-softf16'}-{_sources_hash()}")


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


def is_cached(dispatcher, args: tuple) -> bool:
    """Whether calling `dispatcher(*args)` would load its code (in memory already, or in
    numba's on-disk cache) rather than compile it: the index numba keeps beside the cached
    code is read, the code is not. True when the cache cannot be read this way (numba's
    cache internals changed, say): the caller then does what it did without asking."""
    try:
        from numba import typeof
        from numba.core.typing.typeof import Purpose

        sig = tuple(typeof(a, Purpose.argument) for a in args)
        if any(tuple(s) == sig for s in dispatcher.signatures):
            return True
        cache = dispatcher._cache
        if not hasattr(cache, "_cache_file"):  # not cached on disk: it compiles
            return False
        key = cache._index_key(sig, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - any failure: assume cached, as before this check
        return True
