"""The fused decode step (one compiled call per token) computes what the per-operation
path computes."""

import numba
import numpy as np
import pytest
from conftest import LLAMA_FAMILY, reference
from reference_checks import check_fused_equals_per_operation, decode_fused_or_not

import edgellm
from edgellm.kernels.sync import CALM, SPIN_TICKS, atomic_add, barrier, new_state, ticks
from edgellm.runtime import numba_setup, simd


@pytest.mark.parametrize("name", LLAMA_FAMILY)
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_equals_per_operation_path(name, kind, threads, converted):
    check_fused_equals_per_operation(converted(name, kind), name, threads)


@pytest.mark.parametrize("name", ["gemma3", "phi3", "qwen3-moe", "mixtral"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_architecture_decodes_through_the_fused_step(name, kind, threads, converted):
    """Gemma 3 (sliding and global caches, two RoPE bases, sandwich norms), Phi-3 (fused
    projections, partial RoPE) and the MoE models (routed experts) reach the fused step,
    and it computes what their per-operation path computes."""
    check_fused_equals_per_operation(converted(name, kind), name, threads)


@pytest.mark.parametrize("name", ["gemma3", "phi3", "qwen3-moe", "olmo2"])
def test_fused_step_matches_layer_by_layer(name, converted):
    """The model cut after each layer in turn (steps and weights of layers < n, then the
    head): the fused program compiled from those steps equals the per-operation path, so
    a difference would show at the first layer whose steps it compiles wrongly."""
    from edgellm.step.fused import FusedDecoder

    ids = reference(name)["input_ids"][:12]
    with edgellm.load(converted(name, "q8_0"), precise=True, threads=2, kv_type="f32") as llm:
        m = llm.model
        layers, steps = m.layers, m.layer_steps
        for n in range(1, len(layers) + 1):
            m.layers, m._layer_steps = layers[:n], steps[:n]
            m.fused = FusedDecoder.build(m)
            assert m.fused is not None
            a, b = decode_fused_or_not(llm, ids, True), decode_fused_or_not(llm, ids, False)
            assert np.abs(a - b).max() < 1e-4, n


def test_fused_is_an_option_of_load(converted, monkeypatch):
    from edgellm.commands.common import fused_default

    with edgellm.load(converted("gemma3", "q8_0"), fused=False) as llm:
        assert llm.model.fused is None
    monkeypatch.setenv("EDGELLM_FUSED", "0")
    assert not fused_default()
    monkeypatch.delenv("EDGELLM_FUSED")
    assert fused_default()


def test_model_code_reads_no_environment():
    """Choices reach arch/ and kernels/ as arguments (load(fused=...), threads=...): the
    environment is read by the CLI (EDGELLM_FUSED) and numba_setup.py (EDGELLM_PORTABLE,
    the cache and threading settings) only."""
    import re
    from pathlib import Path

    root = Path(edgellm.__file__).parent
    files = sorted((root / "arch").glob("*.py")) + sorted((root / "kernels").glob("*.py"))
    assert len(files) > 20
    for f in files:
        assert not re.search(r"\benviron\b|getenv", f.read_text()), f.name


def test_fused_follows_the_reference_at_q8_0(converted):
    ref = reference("qwen2")
    with edgellm.load(converted("qwen2", "q8_0"), precise=True) as llm:
        m = llm.model
        m.reset()
        last, out = m.forward(ref["input_ids"], want="last"), []
        for _ in range(8):
            out.append(int(last.argmax()))
            last = m.forward([out[-1]], want="last")
    assert out == list(ref["greedy_ids"][:8])


def test_fused_through_context_shifts(converted):
    ids = reference("llama")["input_ids"]
    with edgellm.load(converted("llama", "q8_0"), context=16, precise=True,
                      kv_type="f32") as llm:
        a = decode_fused_or_not(llm, ids, True)
        b = decode_fused_or_not(llm, ids, False)
    assert np.abs(a - b).max() < 1e-4


def test_float_weights_use_the_per_operation_path(converted):
    with edgellm.load(converted("llama", "f32")) as llm:
        assert llm.model.fused is None


def test_threading_layer_is_not_workqueue(converted):
    with edgellm.load(converted("llama", "q8_0"), threads=2) as llm:
        llm.logits([1, 2, 3])
        assert numba_setup.check_threading_layer() in ("omp", "tbb")


def test_thread_choice_falls_back_to_serial_under_contention_and_returns():
    """ThreadChoice: quiet parallel steps never probe serial; steps 5x slower than the best
    (a busy machine) try serial at once and keep it while it is faster; once the machine is
    quiet again a probe every PROBE steps finds parallel faster and switches back."""
    from edgellm.step.schedule import ThreadChoice

    c = ThreadChoice()
    times = {True: 1.0, False: 1.8}

    def run(n):
        modes = []
        for _ in range(n):
            par = c.parallel()
            c.record(par, times[par])
            modes.append(par)
        return modes

    assert all(run(200))  # quiet: always parallel, no probe
    times[True] = 5.0  # contention: the parallel step is 5x slower
    modes = run(3)
    assert modes[0] and not modes[1] and not modes[2]  # one slow step, then serial
    modes = run(4 * ThreadChoice.PROBE)
    assert 1 <= sum(modes) <= 5  # parallel only probed, about every PROBE steps
    times[True] = 1.0  # quiet again
    modes = run(2 * ThreadChoice.PROBE)
    assert all(modes[-ThreadChoice.PROBE:])


def test_thread_choice_stays_parallel_when_serial_is_only_about_as_fast():
    """A parallel step's late outlier (the server's clients sharing the cores) probes serial;
    a serial step about as fast as parallel's average does not take over (MARGIN), one
    clearly faster does."""
    from edgellm.step.schedule import ThreadChoice

    c = ThreadChoice()
    for _ in range(20):
        c.record(c.parallel(), 6.0)
    assert c.parallel()
    c.record(True, 30.0)  # one late step: parallel's average 6 -> 13.2
    assert not c.parallel()  # probe serial
    c.record(False, 12.0)  # about as fast as parallel's average: stay parallel
    assert all(c.parallel() for _ in range(5))
    c = ThreadChoice()
    for _ in range(20):
        c.record(c.parallel(), 6.0)
    c.record(True, 30.0)
    assert not c.parallel()
    c.record(False, 8.0)  # clearly faster than 13.2: serial
    assert not c.parallel()


@numba.njit(parallel=True, cache=False)
def _late_rounds(state, out, late_ticks, n):
    """2 workers meet at n barriers; before each, one of them (in turn) arrives late."""
    for tid in numba.prange(2):
        for k in range(n):
            if tid == k % 2:
                t0 = ticks()
                while ticks() - t0 < late_ticks:
                    pass
            out[tid, k] = atomic_add(state, 1, 0)  # the generation before the barrier
            barrier(state, 2)


@pytest.mark.serial  # another process on the cores changes which waits sleep
@pytest.mark.skipif(numba_setup.THREADING_LAYER != "omp" or not simd.X86,
                    reason="needs omp's workers and the x86 time-stamp counter")
def test_barrier_sleeps_and_wakes():
    """Waits longer than the spin budget go to sleep (futex) and are woken: every worker
    sees each generation once, and no sleeper is left counted."""
    prev = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        state, out = new_state(), np.zeros((2, 6), np.int64)
        _late_rounds(state, out, 20 * SPIN_TICKS, 6)
    finally:
        numba.set_num_threads(prev)
    assert state[:3].tolist() == [0, 6, 0]
    assert (out == np.arange(6)).all()
    assert state[3] >= CALM - 1  # the sleeps: short spins for the next barriers


@pytest.mark.serial  # another process on the cores makes a spinning wait sleep
@pytest.mark.skipif(numba_setup.THREADING_LAYER != "omp" or not simd.X86,
                    reason="needs omp's workers and the x86 time-stamp counter")
def test_barrier_spins_long_until_a_wait_sleeps():
    """A partner late by a few short spin budgets (a server's request thread preempting a
    worker) is waited for spinning while no wait has slept lately; after one has, the next
    CALM barriers spin short and such waits sleep (each sleep renews the count)."""
    prev = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        out = np.zeros((2, 6), np.int64)
        for _ in range(3):  # the host may preempt a worker past its long spin (one CI run
            calm = new_state()  # in several on a quiet KVM guest): calm once in three
            _late_rounds(calm, out, 4 * SPIN_TICKS, 6)
            if calm.tolist() == [0, 6, 0, 0]:
                break
        busy = new_state()
        busy[3] = 10  # a wait slept ten barriers ago
        _late_rounds(busy, out, 4 * SPIN_TICKS, 6)
    finally:
        numba.set_num_threads(prev)
    assert calm.tolist() == [0, 6, 0, 0]  # no wait slept
    assert busy[:3].tolist() == [0, 6, 0] and busy[3] >= CALM - 1  # they slept
