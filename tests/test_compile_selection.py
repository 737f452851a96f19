"""Compile only what a model needs: a kernel dispatched by type code (family.by_kind) and
called with the code as a constant compiles that type's code alone, and the K-quant entries
(registry.py: one per type) pass their type's code so. A first run on a q4_0 file with a
q6_k embedding compiles q6_k's dequantizer, not all seven K-quant types'."""

import os
import subprocess
import sys
import textwrap

from numba import njit

from edgellm.kernels import family
from edgellm.kernels.jit import GLUE


def _cases():
    made = {}

    def case(c):
        @njit(**GLUE)
        def f(x):
            return x * c
        made[c] = f
        return f
    return made, case


def test_by_kind_on_a_constant_code_compiles_that_case_alone():
    made, case = _cases()
    pick = family.by_kind([2, 3, 5], case)
    code = 3

    @njit(**GLUE)
    def one(x):
        return pick(code, x)

    assert one(7) == 21
    assert [c for c, f in made.items() if f.signatures] == [3]


def test_by_kind_on_a_run_time_code_branches_over_every_case():
    made, case = _cases()
    pick = family.by_kind([2, 3, 5], case)

    @njit(**GLUE)
    def any_(kind, x):
        return pick(kind, x)

    assert [any_(k, 7) for k in (2, 3, 5, 9)] == [14, 21, 35, 35]  # the last takes the rest
    assert sorted(c for c, f in made.items() if f.signatures) == [2, 3, 5]


def test_by_kind_on_a_constant_code_outside_its_codes_takes_the_tail():
    made, case = _cases()

    @njit(**GLUE)
    def tail(x):
        return -x
    pick = family.by_kind([2, 3], case, tail)

    @njit(**GLUE)
    def other(x):
        return pick(4, x)

    assert other(7) == -7 and not any(f.signatures for f in made.values())


CHILD = textwrap.dedent("""
    import numpy as np
    from edgellm.kernels import kquant, registry
    from edgellm.modelfile import quant

    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 512)).astype(np.float32)
    w = quant.quantize(x, "q6_k")
    ref = quant.dequantize(w, "q6_k", x.shape, 256)
    ids = np.array([0, 7, 23])
    out = np.zeros((3, 512), np.float32)
    registry.FLOAT["q6_k"].embed(w, 256, ids, out)
    assert np.array_equal(out, ref[ids])
    y = np.zeros((1, 24), np.float32)
    registry.FLOAT["q6_k"].rows(w, 256, x[:1], y, 0, 24)
    np.testing.assert_allclose(y[0], ref @ x[0], rtol=1e-4, atol=1e-3)
    print(sorted(n for n in dir(kquant) if n.startswith("_deq_q")
                 and getattr(kquant, n).signatures))
""")


def test_a_q6_k_embedding_compiles_q6_k_alone(tmp_path):
    """In a fresh kernel cache (so that everything compiles): the q6_k entries compile the
    q6_k dequantizer and none of the other six types'."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("EDGELLM_HOME", None)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "['_deq_q6_k']"
