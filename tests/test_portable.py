"""The portable kernel path (generic vector IR, no x86 intrinsics) is chosen where it must
be, and computes what the VNNI path computes.

aarch64 (a Raspberry Pi) always runs the portable path; on x86 it runs where the CPU lacks
AVX512-VNNI. So that it cannot rot on a VNNI machine, the linear-kernel tests and the fused
decode tests run again here in a subprocess with EDGELLM_PORTABLE=1 (on aarch64 the suite
itself already runs them on the portable path). scripts/test-arm64.sh runs this file and the
kernel tests on an emulated aarch64 under several Cortex-A CPU models.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgellm.kernels import jit
from edgellm.runtime import numba_setup, simd

ROOT = Path(__file__).resolve().parents[1]
MACHINE = platform.machine().lower()
X86 = MACHINE in ("x86_64", "amd64")
ARM64 = MACHINE in ("aarch64", "arm64")


@pytest.fixture
def host(monkeypatch):
    """host(features, cpu_name=None, portable=None) -> the SIMD path on such a host, with
    EDGELLM_PORTABLE set to `portable` (read as numba_setup reads it for the process)."""
    def select(features: set[str], cpu_name: str | None = None, portable: str | None = None):
        flags = {f: True for f in features}
        monkeypatch.setattr(simd.llb, "get_host_cpu_features", lambda: flags)
        monkeypatch.setattr(simd, "target_features", lambda: set(features))
        monkeypatch.setattr(simd.config, "CPU_NAME", cpu_name)
        if portable is None:
            monkeypatch.delenv("EDGELLM_PORTABLE", raising=False)
        else:
            monkeypatch.setenv("EDGELLM_PORTABLE", portable)
        return simd.select_path(portable=numba_setup.env_flag("EDGELLM_PORTABLE"))
    return select


def test_path_selection(host):
    vnni = {"avx512f", "avx512bw", "avx512vl", "avx512vnni", "f16c"}
    assert host(vnni) == "vnni"
    assert host(vnni - {"avx512vnni"}) == "portable"  # e.g. Zen 3, Skylake-X
    assert host(vnni - {"avx512vl"}) == "portable"
    assert host({"avx2", "fma", "f16c"}) == "portable"
    assert host({"neon", "fp-armv8", "dotprod"}) == "portable"  # a Pi 5's features
    assert host(vnni, cpu_name="generic") == "portable"
    assert host(vnni, portable="1") == "portable"
    assert host(vnni, portable="0") == "vnni"


@pytest.mark.skipif(not ARM64, reason="aarch64 only")
def test_aarch64_runs_the_portable_path():
    assert simd.SIMD_PATH == "portable" and not simd.VNNI
    assert simd.NATIVE_F16  # aarch64 converts f16 in hardware
    assert "-portable" in jit.CACHE_TAG


@pytest.mark.parametrize("threads", [1, 2])
def test_spin_barrier_runs_on_this_cpu(threads):
    """The fused decode's barrier (sync.py: atomic adds and the CPU's spin-wait hint, x86
    `pause` or aarch64 `yield`) compiles for this CPU, and no worker passes it early."""
    import numba

    from edgellm.runtime import numba_setup

    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("one thread only")
    if threads > 1 and numba_setup.THREADING_LAYER != "omp":
        pytest.skip("the spin barrier needs omp (one prange iteration per thread)")
    rounds = 200
    out = _barrier_rounds(threads, rounds)
    # after round r's barrier every worker has added its 1: the counter reads (r+1) x threads
    assert (out == (np.arange(rounds)[:, None] + 1) * threads).all()


def _barrier_rounds(threads: int, rounds: int) -> np.ndarray:
    import numba
    from numba import njit, prange

    from edgellm.kernels.sync import atomic_add, barrier, new_state

    @njit(parallel=True)
    def run(nt, counter, state, out):
        for tid in prange(nt):
            for r in range(out.shape[0]):
                atomic_add(counter, 0, 1)
                barrier(state, nt)
                out[r, tid] = atomic_add(counter, 0, 0)
                barrier(state, nt)

    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        out = np.zeros((rounds, threads), np.int64)
        run(threads, np.zeros(1, np.int64), new_state(), out)
    finally:
        numba.set_num_threads(previous)
    return out


# Left out of the child: the fused step on two threads for the models whose matrices have
# llama's shapes (hidden 64, intermediate 128, 4 and 2 heads of 16, a 512 x 64 head), so
# that the portable row kernels run on the same rows split the same way between the
# threads as in llama's two-thread case, which the child keeps for each type; their own
# operations (qwen2's q/k/v biases, mistral's sliding window, the bf16 shards read by the
# converter) are the same code on either path, run on the portable path on one thread here
# and on two threads by the suite itself.
PORTABLE_REPEATS = [f"tests/test_fused.py::test_fused_equals_per_operation_path[2-{kind}-{name}]"
                    for name in ("qwen2", "mistral-swa", "llama-bf16-sharded")
                    for kind in ("q8_0", "q4_0", "q4_1")]
# Left out too: test_kernels_linear.py's two-thread cases. On one token they run the
# parallel kernels (kernels/matvec.py's mv, mvp and the beams' mvb: a prange over chunks of
# rows, each through mv_rows, mvp_rows or mvb_rows); on more, the prefill kernels the
# one-thread cases compile (one kernel for any thread count). Their portable code is the
# rows kernels and the tiles, which the one-thread cases run here on every type, block
# size, row count and activation type; the split into chunks is the same code on either
# path, run on two threads by the suite itself; and the child still runs mv and mvp on two
# threads where the models use them (test_fused.py's two-thread cases: the per-operation
# path of the q8_0, q4_0 and q4_1 files, int16 and float activations).
PORTABLE_SKIPS = "not 2threads"


@pytest.mark.skipif(not X86, reason="on aarch64 the whole suite runs the portable path")
@pytest.mark.skipif(simd.SIMD_PATH == "portable",
                    reason="this host runs the portable path already: the suite ran these")
def test_kernel_and_fused_tests_pass_on_the_portable_path():
    env = dict(os.environ, EDGELLM_PORTABLE="1")
    # not the serial tests (barrier timing, the same code on either path): the README's
    # command runs this test beside another worker
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
           "not serial", "tests/test_kernels_linear.py", "tests/test_fused.py",
           "tests/test_kquant_superblock.py", "tests/test_layout.py", "-k", PORTABLE_SKIPS]
    for arg in PORTABLE_REPEATS:
        cmd += ["--deselect", arg]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail


@pytest.mark.skipif(not X86, reason="aarch64 has no other path")
def test_edgellm_portable_forces_the_portable_path():
    env = dict(os.environ, EDGELLM_PORTABLE="1")
    probe = subprocess.run([sys.executable, "-c",
                            "from edgellm.runtime import simd; print(simd.SIMD_PATH)"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert probe.stdout.strip() == "portable", probe.stderr[-2000:]
