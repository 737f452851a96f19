"""Where the test suite's time goes: a pytest plugin recording every numba compile, and a
summary of what it recorded.

Each process (xdist workers, and the children tests start: they inherit PYTEST_ADDOPTS)
appends one JSON line per compile to $COMPILE_OUT.<pid>: the function, its argument types,
the test running, seconds inside the compile (incl) and outside its nested compiles (excl,
cpu_excl: CPU seconds). Run the suite as CI does, on a cold kernel cache:

  rm -rf /tmp/prof-home /tmp/compile.*
  HOME=/tmp/prof-home PYTHONPATH=$PWD/scripts COMPILE_OUT=/tmp/compile \\
      PYTEST_ADDOPTS="-p compile_profile" python -m pytest -n 2 -m "not serial" --durations=60
  python scripts/compile_profile.py /tmp/compile      # the summary
"""

from __future__ import annotations

import json
import os
import sys
import time

_out = None
_stack: list[list[float]] = []


def _file():
    global _out
    if _out is None:
        path = os.environ.get("COMPILE_OUT", "/tmp/compile") + f".{os.getpid()}"
        _out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    return _out


def _listen() -> None:
    from numba.core import event

    class Compiles(event.Listener):
        def on_start(self, ev):
            _stack.append([time.perf_counter(), time.process_time(), 0.0, 0.0])

        def on_end(self, ev):
            t0, c0, kids, kids_cpu = _stack.pop()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if _stack:
                _stack[-1][2] += dt
                _stack[-1][3] += dc
            disp = (ev.data or {}).get("dispatcher")
            fn = getattr(disp, "py_func", None)
            name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', disp)}"
            _file().write(json.dumps({
                "fn": name, "sig": str((ev.data or {}).get("args")), "incl": dt,
                "excl": dt - kids, "cpu_excl": dc - kids_cpu, "depth": len(_stack),
                "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]}) + "\n")

    event.register("numba:compile", Compiles())


def pytest_configure(config):  # a pytest plugin hook: listen from the start
    _listen()


def summary(prefix: str, top: int = 25) -> None:
    """CPU seconds compiling, by process, by function and by test."""
    import collections
    import glob

    rows = []
    for path in sorted(glob.glob(prefix + ".*")):
        mine = [json.loads(line) for line in open(path)]
        rows += mine
        print(f"{path}: {len(mine)} compiles, {sum(r['cpu_excl'] for r in mine):.0f} CPU-s")
    print(f"all: {len(rows)} compiles, {sum(r['cpu_excl'] for r in rows):.0f} CPU-s")
    for key in ("fn", "test"):
        total, count = collections.Counter(), collections.Counter()
        for r in rows:
            total[r[key]] += r["cpu_excl"]
            count[r[key]] += 1
        print(f"\nby {key} (CPU-s, compiles):")
        for name, cpu in total.most_common(top):
            print(f"{cpu:8.1f} {count[name]:5d}  {name}")


if __name__ == "__main__":
    summary(sys.argv[1] if len(sys.argv) > 1 else "/tmp/compile")
