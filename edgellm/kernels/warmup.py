"""Tell the user when kernels are being compiled, and count what was compiled.

numba fires a "numba:compile" event only when it compiles (not when a kernel loads from the
cache), so `CompileWatch` sees exactly the first run's work: every kernel called from
Python (top level) that had to be compiled, each with its time, the nested functions it
compiled inside counted with it. `compile_notice` shows them as they start on stderr
("edgellm: compiling kernels 3: mm_q4_1") and is silent on a warm start.
"""

from __future__ import annotations

import contextlib
import sys
import time

from numba.core import event

from ..runtime.numba_setup import CACHE_DIR

__all__ = ["CompileWatch", "compile_notice", "compiled"]


class CompileWatch(event.Listener):
    """Counts top-level compiles (`count`, and `kernels`: [(name, seconds)]) while it is
    registered; `say(n, name)` is told when the n-th one starts."""

    def __init__(self, say=None):
        self.say, self.depth, self.count = say, 0, 0
        self.kernels: list[tuple[str, float]] = []
        self._t0 = 0.0

    def on_start(self, ev) -> None:
        self.depth += 1
        if self.depth == 1:
            self.count += 1
            self._t0 = time.perf_counter()
            if self.say is not None:
                self.say(self.count, _name(ev))

    def on_end(self, ev) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.kernels.append((_name(ev), time.perf_counter() - self._t0))


def _name(ev) -> str:
    return getattr(ev.data["dispatcher"].py_func, "__name__", "?")


_PROCESS = CompileWatch()  # every compile of this process, from the kernels' first import
event.register("numba:compile", _PROCESS)


def compiled() -> int:
    """Kernels compiled (not loaded from the cache) in this process so far."""
    return _PROCESS.count


@contextlib.contextmanager
def compile_notice(say):
    """Around the first model run: a line on stderr for each kernel it compiles (the first
    run on a machine, or after the kernels changed) and the total time; silent when every
    kernel loads from the cache."""
    tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()

    def progress(n: int, name: str) -> None:
        if n == 1:
            say("edgellm: compiling kernels for this machine (first run only)...")
        line = f"edgellm: compiling kernels {n}: {name} ({time.perf_counter() - t0:.0f} s)"
        if tty:
            print("\r" + line.ljust(72), end="", file=sys.stderr, flush=True)
        else:
            say(line)

    t0 = time.perf_counter()
    watch = CompileWatch(progress)
    event.register("numba:compile", watch)
    try:
        yield watch
    finally:
        event.unregister("numba:compile", watch)
    if watch.count:
        if tty:
            print(file=sys.stderr)
        say(f"edgellm: kernels compiled in {time.perf_counter() - t0:.1f} s ({watch.count} "
            f"kernels) and cached in {CACHE_DIR}")


MADV_DONTNEED = 4  # Linux


def release_compiler_pages(library: str = "libllvmlite") -> int:
    """Drop from this process's resident set the pages of LLVM's library (~70 MiB: loading
    kernels from the cache touches them) that are clean copies of the file: its mappings
    that are not writable and hold no private (copied-on-write) page. A page needed again,
    by a later compile, is read back from the file; nothing is lost. Linux only (elsewhere,
    and on any error, it does nothing); returns the bytes released."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        regions, released = [], 0
        with open("/proc/self/smaps") as f:
            current = None
            for line in f:
                parts = line.split()
                if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                    current = None
                    if len(parts) > 5 and library in parts[5] and "w" not in parts[1]:
                        lo, hi = (int(x, 16) for x in parts[0].split("-"))
                        current = [lo, hi, 0, 0]
                        regions.append(current)
                elif current is not None and parts[0] == "Rss:":
                    current[2] = int(parts[1])
                elif current is not None and parts[0] == "Anonymous:":
                    current[3] = int(parts[1])
        madvise = libc.madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        for lo, hi, rss_kb, anon_kb in regions:
            if anon_kb == 0 and rss_kb and madvise(lo, hi - lo, MADV_DONTNEED) == 0:
                released += rss_kb * 1024
        return released
    except (OSError, AttributeError, ValueError):
        return 0
