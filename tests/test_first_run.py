"""The first run's background compile (commands/first_run.py): a child process compiles the
decode step into the kernel cache while the CLI compiles the prefill and answers; the
answer is the one a warm run gives, and a child that fails is reported, its work done here."""

import os
import subprocess
import sys

import numba
import numpy as np

from edgellm.commands import common, first_run
from edgellm.kernels.jit import is_cached
from edgellm.step.fused import FusedDecoder


def _generate(model: str, capsys) -> tuple[str, str]:
    from edgellm.cli import main

    argv = ["generate", "-m", model, "-p", "def f(x): return", "-n", "12", "--temp", "0",
            "-t", "2"]
    assert main(argv) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_background_compile_gives_the_warm_runs_answer(converted, capsys, monkeypatch):
    """Forced to see the step as not compiled yet, generate has a child "compile" it
    (here: load it from the cache), waits for it at the first decode step, and answers as
    the run without a child did; every child has exited when the command returns."""
    model = str(converted("llama", "q4_1"))
    warm, _ = _generate(model, capsys)
    started = []
    real_start = first_run.Background.start

    def start(self, jobs):
        real_start(self, jobs)
        started.append((self, self.children[-1][0]))

    monkeypatch.setattr(FusedDecoder, "cached", lambda self: False)
    monkeypatch.setattr(first_run, "worth_it", lambda: True)
    monkeypatch.setattr(first_run.Background, "start", start)
    out, err = _generate(model, capsys)
    assert out == warm and out.strip()
    assert "compiling the decode step in a second process" in err
    assert "failed" not in err
    assert len(started) == 2  # the step's forms, the other precision
    for background, proc in started:
        assert proc.returncode == 0 and background.children == []


def test_a_failed_child_is_reported_and_its_work_left_to_this_process(tmp_path):
    said = []
    spec = dict(path=str(tmp_path / "missing.edgellm"), threads=1, context=None,
                precise=False, kv_type="f32", lora=None, fused_env=None)
    background = first_run.Background(spec, said.append)
    background.start(["decode"])
    assert background.wait_for("decode") is False
    assert len(said) == 1 and "background compile of 'decode' failed" in said[0]
    assert "missing.edgellm" in said[0]  # the child's own one-line error
    background.finish()
    assert background.children == []


def test_worth_it_needs_a_second_core(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert first_run.worth_it() is False
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(first_run, "MIN_AVAILABLE", 1 << 60)  # more than any machine has
    assert first_run.worth_it() is False


def test_is_cached_tells_compiled_from_not_yet():
    @numba.njit  # not cached on disk: compiles on its first call
    def plus_one(x):
        return x + 1

    assert is_cached(plus_one, (np.float32(1),)) is False
    plus_one(np.float32(1))
    assert is_cached(plus_one, (np.float32(1),)) is True
    assert is_cached(plus_one, (np.int16(1),)) is False


def test_step_cached_reads_the_disk_cache(converted, tmp_path):
    """In a process with an empty kernel cache the step is not cached; in this one (the
    suite has run it) it is."""
    model = str(converted("llama", "q4_1"))
    import edgellm

    with edgellm.load(model, threads=2) as llm:
        llm.model.fused.load()
        assert llm.model.fused.cached() is True
    code = ("import edgellm; llm = edgellm.load(%r, threads=2); "
            "print(llm.model.fused.cached())" % model)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "empty-cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_open_model_uses_no_child_when_the_step_is_cached(converted, monkeypatch):
    import argparse

    model = str(converted("llama", "q4_1"))
    monkeypatch.setattr(first_run, "worth_it", lambda: True)
    args = argparse.Namespace(model=model, threads=2, ctx=None, precise=False,
                              kv_type="f32", lora=None)
    with common.open_model(args, defer_variants=True) as llm:
        llm.model.fused.load()  # compiled by now in this suite
    with common.open_model(args, defer_variants=True) as llm:
        assert llm.background is None and llm.model.fused.ready is None


def test_a_one_token_prompt_does_not_wait_for_the_step(converted):
    """While the step's kernel is still being compiled elsewhere (ready pending), a
    one-token prompt runs as a prefill, with the step's own logits; the next token waits."""
    import edgellm

    with edgellm.load(converted("llama", "q4_1"), threads=2) as llm:
        m = llm.model
        m.reset()
        stepped = m.forward([7], want="last").copy()
        following = m.forward([9], want="last").copy()
        calls = []
        m.reset()
        m.fused.ready = lambda: calls.append("ready")
        np.testing.assert_array_equal(m.forward([7], want="last"), stepped)
        assert calls == []
        np.testing.assert_array_equal(m.forward([9], want="last"), following)
        assert calls == ["ready"] and m.fused.ready is None
