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

from ..numba_setup import CACHE_DIR

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
