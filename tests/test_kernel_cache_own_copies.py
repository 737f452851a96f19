"""A kernel runs the functions it was compiled with, whatever the process compiled or loaded
before it (runtime/numba_loading.py, "linked-copies").

numba links a callee into its caller under a name made of its qualname, types and a
per-process compile counter. Two closures of one factory (family.py's glue) compiled in two
processes can get the same name for different bodies. Processes share one cache here: the
first compiles k1 (glue adding 1), the second k2 (glue adding 2, the same name); a third
loads both (a call bound by name to the first definition in the process: k2 gave 1.0), and
a fourth compiles k3, which calls both loaded kernels (linking their code kept one glue for
both: k3 gave 11.0).
"""

from __future__ import annotations

import os
import subprocess
import sys

from edgellm.kernels import jit  # noqa: F401  (installs numba_loading's changes)
from edgellm.runtime import numba_loading

MODULE = '''
import numba

def make(c):
    @numba.njit(cache=False, _dbg_optnone=True)  # kept a call: never inlined into k1, k2
    def glue(x):
        return x + c
    return glue

g1, g2 = make(1.0), make(2.0)

@numba.njit(cache=True)
def k1(x):
    return g1(x)

@numba.njit(cache=True)
def k2(x):
    return g2(x)

@numba.njit(cache=False)
def k3(x):
    return k1(x) + 10.0 * k2(x)
'''


def _run(tmp_path, code: str) -> str:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    script = f"import edgellm.kernels.jit\nimport glue_mod as m\n{code}"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_cached_kernels_call_their_own_linked_functions(tmp_path):
    assert "linked-copies" in numba_loading.installed()
    (tmp_path / "glue_mod.py").write_text(MODULE)
    assert _run(tmp_path, "print(m.k1(0.0))") == "1.0"  # compiles k1 and caches it
    assert _run(tmp_path, "print(m.k2(0.0))") == "2.0"  # compiles k2 and caches it
    hits = "sum(m.k1.stats.cache_hits.values()) + sum(m.k2.stats.cache_hits.values())"
    assert _run(tmp_path, f"print(m.k1(0.0), m.k2(0.0), {hits})") == "1.0 2.0 2"  # both loaded
    assert _run(tmp_path, f"print(m.k3(0.0), {hits})") == "21.0 2"  # linked from the cache
