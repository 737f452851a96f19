"""Two processes missing the same kernel signature in numba's cache at once compile it once:
the second waits for the first's compile and loads its saved code (runtime/numba_loading.py,
"compile-locks"); a first process that dies while compiling lets the second go on and
compile it itself.

Each process here runs a tiny cached kernel; a listener on numba's compile event (which
numba sends only for a cache miss) writes a file saying it started compiling and, in the
first process, holds the compile open until the test lets it go (or kills it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edgellm
from edgellm.kernels import jit  # noqa: F401  (installs numba_loading's changes)
from edgellm.runtime import numba_loading

ROOT = Path(edgellm.__file__).resolve().parents[1]  # the children run this edgellm

KERNEL = """
from numba import njit

@njit(cache=True)
def plus_one(x):
    return x + 1
"""

# argv: the folder (kernel module and signal files), this process's name, and "hold"
# (wait for the file `go` inside the compile) or "run"
RUN = """
import os, sys, time
folder, name, mode = sys.argv[1:]
sys.path.insert(0, folder)
from edgellm.runtime import numba_loading
numba_loading.install()
from numba.core import event

class Started(event.Listener):
    def on_start(self, ev):
        open(os.path.join(folder, name + ".compiling"), "w").close()
        while mode == "hold" and not os.path.exists(os.path.join(folder, "go")):
            time.sleep(0.02)

    def on_end(self, ev):
        pass

event.register("numba:compile", Started())
import kernel
open(os.path.join(folder, name + ".ready"), "w").close()
print(kernel.plus_one(41), flush=True)
"""


def _start(folder: Path, name: str, mode: str) -> subprocess.Popen:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(folder / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(folder / "run.py"), str(folder), name, mode],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "kernel.py").write_text(KERNEL)
    (tmp_path / "run.py").write_text(RUN)
    return tmp_path


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fcntl locks: POSIX only")
def test_the_second_process_loads_what_the_first_compiled(folder):
    first = _start(folder, "first", "hold")
    _wait_for(folder / "first.compiling", first)
    second = _start(folder, "second", "run")
    _wait_for(folder / "second.ready", second)
    time.sleep(1)  # the second reaches the kernel's cache miss
    assert second.poll() is None, second.communicate()[1][-2000:]  # waiting on the lock
    (folder / "go").touch()
    for proc in (first, second):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert out.split()[0] == "42"
    assert not (folder / "second.compiling").exists()  # it loaded the first's code


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fcntl locks: POSIX only")
def test_a_process_dying_while_compiling_lets_the_other_compile(folder):
    assert "compile-locks" in numba_loading.installed()
    first = _start(folder, "first", "hold")
    _wait_for(folder / "first.compiling", first)
    second = _start(folder, "second", "run")
    _wait_for(folder / "second.ready", second)
    time.sleep(1)
    first.kill()
    first.communicate()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-2000:]
    assert out.split()[0] == "42"
    assert (folder / "second.compiling").exists()  # nothing saved: it compiled itself
