"""Loading cached kernels lighter: what numba does on a cache hit that a warm start pays for.

`install()` (called once by kernels/jit.py, before any kernel loads) changes two things in
how numba loads a kernel from its on-disk cache; compiling is unchanged.

- numba's `Cache.load_overload` refreshes the target context before every load: the first
  time, that imports and installs every lowering registry numba has (a visible share of a
  warm start's time and memory), which only compiling uses. The compiler refreshes the
  contexts itself (`CompilerBase.__init__`), so a cache miss still compiles as before; a
  hit needs only numba's runtime (NRT), which is initialized here.
- A library loaded from the cache keeps its LLVM module for linking (`_shared_module`,
  parsed from the cached bitcode: ~5 MiB for the fused decode step), used only if a later
  compile links against it. The bitcode is kept instead (~15x smaller) and parsed again on
  that first use.

Each change is made only where numba has the internals it relies on (checked here;
numba 0.61-0.68 do); otherwise numba is left as it is and loads as before.
"""

from __future__ import annotations

__all__ = ["install", "installed"]

_INSTALLED: list[str] = []


def installed() -> tuple[str, ...]:
    """The changes install() made: "lazy-refresh", "bitcode-for-linking"."""
    return tuple(_INSTALLED)


def install() -> None:
    """Make both changes where numba allows (idempotent)."""
    if _INSTALLED:
        return
    try:
        from numba.core import caching, codegen
        from numba.core.runtime import rtsys
    except ImportError:
        return
    cache = caching.Cache
    if all(hasattr(cache, n) for n in ("load_overload", "_load_overload",
                                       "_guard_against_spurious_io_errors")) \
            and hasattr(rtsys, "initialize"):
        def load_overload(self, sig, target_context):
            """numba's, without the registries' refresh: loading needs only the NRT."""
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)

        cache.load_overload = load_overload
        _INSTALLED.append("lazy-refresh")

    lib = getattr(codegen, "JITCodeLibrary", None)
    base = getattr(codegen, "CPUCodeLibrary", None)
    if lib is None or base is None or not hasattr(lib, "_unserialize") \
            or not hasattr(base, "_get_module_for_linking"):
        return
    unserialize = lib._unserialize.__func__
    get_module = base._get_module_for_linking
    parse = codegen.ll.parse_bitcode

    def _unserialize(cls, codegen_, state):
        self = unserialize(cls, codegen_, state)
        _name, kind, data = state
        if kind == "object" and getattr(self, "_shared_module", None) is not None:
            self._edgellm_bitcode = data[1]  # parsed again if a compile links this library
            self._shared_module = None
        return self

    def _get_module_for_linking(self):
        bitcode = getattr(self, "_edgellm_bitcode", None)
        if bitcode is not None and self._shared_module is None:
            self._shared_module = parse(bitcode)
            self._edgellm_bitcode = None
        return get_module(self)

    lib._unserialize = classmethod(_unserialize)
    base._get_module_for_linking = _get_module_for_linking
    _INSTALLED.append("bitcode-for-linking")
