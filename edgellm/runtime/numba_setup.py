"""Numba environment for edgellm: import this before numba (edgellm.kernels does).

Only settings the user has not made are touched:
- NUMBA_CACHE_DIR: a directory we know is writable, so `cache=True` kernels load from disk
  on the next start even when the package directory is read-only (otherwise numba can fail
  with "cannot cache function ...: no locator available"). First writable of
  $EDGELLM_HOME/numba-cache, $XDG_CACHE_HOME/edgellm/numba-cache,
  ~/.cache/edgellm/numba-cache, then a directory under the system temp dir.
- NUMBA_THREADING_LAYER: omp if numba's OpenMP pool loads here (libgomp present), else tbb.
  Never workqueue: its parallel-region start costs tens of times omp's, and a
  decode step starts hundreds of regions. If neither loads, numba's default is left alone
  and `check_threading_layer()` warns once the pool has started.

It is also the one place edgellm's own kernel settings are read from the environment:
- EDGELLM_ISA: `ISA`, the instruction set the kernels are built for, read when this module
  is first imported (set it before `import edgellm`):
    native    (default) this CPU: the AVX-512 VNNI path where the CPU has it, else portable.
    portable  the generic vector path (simd.py), compiled for this CPU (LLVM still uses
              its AVX-512 registers where it has them). The same as EDGELLM_PORTABLE=1.
    avx2      what an AVX2 machine without AVX-512 (Haswell and later, Zen 1-3) runs: the
              portable path, and numba told to compile for such a CPU (NUMBA_CPU_NAME and
              NUMBA_CPU_FEATURES: AVX2_CPU, AVX2_FEATURES), so no AVX-512 instruction is
              emitted. x86-64 with AVX2, FMA and F16C only.
  avx2 keeps its compiled kernels apart, in NUMBA_CACHE_DIR/isa-avx2 (portable's share
  the directory with native's, under their own tag: kernels/jit.py's CACHE_TAG).
  Another value is an ArgumentError naming the choices.
- EDGELLM_PORTABLE=1 (or true/yes): `PORTABLE`, the process's default for the kernels' SIMD
  path (runtime/simd.py: select_path(portable=...)), fixed when the kernels are imported;
  True under EDGELLM_ISA=portable or avx2. Set it before `import edgellm` (or assign
  numba_setup.PORTABLE before the kernels load).
- EDGELLM_NO_AMX=1: `NO_AMX`, prefill without Intel AMX tiles where the CPU has them
  (runtime/simd.py's AMX; for comparisons), fixed when the kernels are imported.

`set_threads(n)` validates and sets the number of threads parallel kernels use.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.machinery
import importlib.util
import operator
import os
import sys
import tempfile
import warnings

from ..errors import ArgumentError

__all__ = ["AVX2_CPU", "AVX2_FEATURES", "CACHE_DIR", "ISA", "ISAS", "NO_AMX", "PORTABLE",
           "THREADING_LAYER", "check_threading_layer", "env_flag", "set_threads"]

ISAS = ("native", "portable", "avx2")
# Haswell's features, as LLVM names them: the baseline of every AVX2 CPU since (Zen too).
AVX2_CPU = "haswell"
AVX2_FEATURES = ("+64bit,+aes,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fsgsbase,"
                 "+fxsr,+invpcid,+lzcnt,+mmx,+movbe,+pclmul,+popcnt,+rdrnd,+sahf,+sse,+sse2,"
                 "+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,+xsaveopt")


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _default_cache_dir() -> str:
    """The first writable candidate cache directory (see the module docstring)."""
    candidates = []
    if os.environ.get("EDGELLM_HOME"):
        candidates.append(os.path.join(os.environ["EDGELLM_HOME"], "numba-cache"))
    elif os.environ.get("XDG_CACHE_HOME"):
        candidates.append(os.path.join(os.environ["XDG_CACHE_HOME"], "edgellm", "numba-cache"))
    candidates.append(os.path.join(os.path.expanduser("~"), ".cache", "edgellm", "numba-cache"))
    uid = os.getuid() if hasattr(os, "getuid") else os.getpid()
    candidates.append(os.path.join(tempfile.gettempdir(), f"edgellm-numba-cache-{uid}"))
    for path in candidates:
        if _writable_dir(path):
            return path
    return tempfile.mkdtemp(prefix="edgellm-numba-cache-")


def _numba_extension(name: str) -> str | None:
    """Path of numba's compiled extension numba/np/ufunc/<name>, found without importing numba."""
    spec = importlib.util.find_spec("numba")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            hits = glob.glob(os.path.join(root, "np", "ufunc", name + suffix))
            if hits:
                return hits[0]
    return None


def _loads(*libs: str | None) -> bool:
    """True if every shared library loads (dlopen resolves its dependencies, e.g. libgomp)."""
    try:
        for lib in libs:
            if lib is None:
                return False
            ctypes.CDLL(lib)
        return True
    except OSError:
        return False


def _pick_threading_layer() -> str | None:
    if _loads(_numba_extension("omppool")):
        return "omp"
    tbb = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib"}.get(sys.platform, "tbb12.dll")
    if _loads(tbb, _numba_extension("tbbpool")):
        return "tbb"
    return None


def _isa() -> str:
    """EDGELLM_ISA, checked: its value, or ArgumentError (one line) for one we cannot run."""
    isa = os.environ.get("EDGELLM_ISA", "").strip().lower() or "native"
    if isa not in ISAS:
        raise ArgumentError(f"EDGELLM_ISA={os.environ['EDGELLM_ISA']!r} is not one of "
                            f"{', '.join(ISAS)}")
    if isa == "avx2":
        import platform

        import llvmlite.binding as llb  # llvmlite, not numba: numba reads our settings

        host = llb.get_host_cpu_features() if platform.machine().lower() in (
            "x86_64", "amd64") else {}
        missing = [f for f in ("avx2", "fma", "f16c") if not host.get(f)]
        if missing:
            raise ArgumentError(f"EDGELLM_ISA=avx2 needs an x86-64 CPU with AVX2, FMA and "
                                f"F16C; this one lacks {', '.join(missing)}")
        for name, value in (("NUMBA_CPU_NAME", AVX2_CPU), ("NUMBA_CPU_FEATURES", AVX2_FEATURES)):
            if os.environ.get(name, value) != value:
                raise ArgumentError(f"EDGELLM_ISA=avx2 sets {name} itself; it is set to "
                                    f"{os.environ[name]!r} (unset one of the two)")
    return isa


def _setup() -> tuple[str, str | None]:
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = _default_cache_dir()
    if ISA == "avx2":  # compiled for another CPU: never in the same cache index as the
        sub = "isa-" + ISA  # host's kernels (idempotent: child processes inherit it)
        if os.path.basename(os.path.normpath(os.environ["NUMBA_CACHE_DIR"])) != sub:
            os.environ["NUMBA_CACHE_DIR"] = os.path.join(os.environ["NUMBA_CACHE_DIR"], sub)
        os.environ["NUMBA_CPU_NAME"] = AVX2_CPU
        os.environ["NUMBA_CPU_FEATURES"] = AVX2_FEATURES
    if not os.environ.get("NUMBA_THREADING_LAYER"):
        layer = _pick_threading_layer()
        if layer is not None:
            os.environ["NUMBA_THREADING_LAYER"] = layer
    if "numba" in sys.modules:  # imported before us: make numba re-read the environment
        from numba.core import config

        config.reload_config()
    return os.environ["NUMBA_CACHE_DIR"], os.environ.get("NUMBA_THREADING_LAYER")


def env_flag(name: str) -> bool:
    """An on/off environment variable: unset, "", 0, false or no is off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


ISA = _isa()
CACHE_DIR, THREADING_LAYER = _setup()
PORTABLE = env_flag("EDGELLM_PORTABLE") or ISA != "native"
NO_AMX = env_flag("EDGELLM_NO_AMX")


def check_threading_layer(strict: bool = False) -> str:
    """Return numba's threading layer; call it after the first parallel kernel has run.

    workqueue (parallel regions far slower to start than omp/tbb's) warns, or raises
    RuntimeError when `strict`. Returns "" if no parallel kernel has run yet.
    """
    import numba

    try:
        layer = numba.threading_layer()
    except ValueError:  # the thread pool has not started yet
        return ""
    if layer == "workqueue":
        msg = ("numba is using the 'workqueue' threading layer: every parallel kernel call "
               "pays ~80 us of start-up. Install OpenMP (libgomp) or tbb "
               "(`pip install tbb`), or set NUMBA_THREADING_LAYER=omp.")
        if strict:
            raise RuntimeError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return layer


def set_threads(n: int) -> int:
    """Set the threads parallel kernels use (1..NUMBA_NUM_THREADS); returns the previous count."""
    import numba

    limit = numba.config.NUMBA_NUM_THREADS
    try:
        k = operator.index(n)
    except TypeError:
        k = 0
    if isinstance(n, bool) or not 1 <= k <= limit:
        raise ValueError(f"threads must be an integer in 1..{limit} (NUMBA_NUM_THREADS), "
                         f"got {n!r}")
    previous = numba.get_num_threads()
    numba.set_num_threads(k)
    return previous
