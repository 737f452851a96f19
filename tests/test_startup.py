"""Start-up: the compile notice counts what numba compiles (and only that), and the first
run's warm-up compiles the other variants (the fused step's serial and parallel forms, the
other precision's prefill) without changing what the model computes."""

import numba
import numpy as np
from conftest import reference

import edgellm
from edgellm.kernels import warmup
from edgellm.step import decode_step as ds


def test_compile_notice_shows_each_compile_and_is_silent_when_nothing_compiles():
    @numba.njit  # not cached: compiles on its first call
    def doubled(x):
        return 2 * x

    lines = []
    with warmup.compile_notice(lines.append) as watch:
        assert doubled(21) == 42
    assert watch.count == 1 and watch.kernels[0][0] == "doubled"
    assert lines[0].startswith("edgellm: compiling kernels for this machine")
    assert lines[1].startswith("edgellm: compiling kernels 1: doubled")
    assert lines[-1].startswith("edgellm: kernels compiled in") and "1 kernels" in lines[-1]
    before = warmup.compiled()
    lines.clear()
    with warmup.compile_notice(lines.append) as watch:
        assert doubled(1) == 2  # compiled already
    assert watch.count == 0 and lines == [] and warmup.compiled() == before


def test_first_run_warmup_compiles_both_step_forms_and_both_precisions(converted,
                                                                       monkeypatch):
    """Forced to think it compiled (as on a cold cache), warmup runs the serial and the
    parallel step and the precise prefill, then leaves the model computing what it did."""
    ids = reference("llama")["input_ids"][:6]
    calls = []

    class Spy:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __call__(self, *args):
            calls.append(self.name)
            return self.kernel(*args)

        def compile(self, sig):
            calls.append("load " + self.name)
            return self.kernel.compile(sig)

    monkeypatch.setattr(ds, "decode_parallel", Spy("parallel", ds.decode_parallel))
    monkeypatch.setattr(ds, "decode_serial", Spy("serial", ds.decode_serial))
    with edgellm.load(converted("llama", "q4_1"), threads=2) as llm:
        m = llm.model
        m.reset()
        before = m.forward(ids, want="all"), m.forward([int(ids[0])], want="last").copy()
        counts = iter(range(100))
        monkeypatch.setattr(warmup, "compiled", lambda: next(counts))
        released = []
        calls.clear()
        m.warmup(lambda: released.append(len(calls)))
        assert calls[0] == "load parallel" and released[0] == 1  # loaded before any run
        assert {"parallel", "serial"} <= set(calls) and len(released) == 2
        assert not m.precise and m.int8_acts and len(m.tokens) == 0
        after = m.forward(ids, want="all"), m.forward([int(ids[0])], want="last")
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[1], after[1])


def test_released_compiler_pages_come_back_when_needed(converted):
    """release_compiler_pages drops clean pages of LLVM's library only: the loaded kernels
    still run, and a new compile (which reads those pages again) still works."""
    with edgellm.load(converted("llama", "q8_0")) as llm:
        ids = reference("llama")["input_ids"][:4]
        a = llm.logits(ids)
        assert warmup.release_compiler_pages() >= 0
        np.testing.assert_array_equal(llm.logits(ids), a)

        @numba.njit
        def tripled(x):
            return 3 * x

        assert tripled(3) == 9


def test_deferred_variants_compile_when_asked(converted, monkeypatch):
    """warmup(variants=False) (the CLI's generate: the first token does not wait) leaves the
    variants due; warm_variants (finish_first_run, after the answer) runs them."""
    from edgellm.commands.common import finish_first_run

    calls = []

    def spy(name, kernel):
        def run(*args):
            calls.append(name)
            return kernel(*args)
        run.compile = kernel.compile
        return run

    monkeypatch.setattr(ds, "decode_parallel", spy("parallel", ds.decode_parallel))
    monkeypatch.setattr(ds, "decode_serial", spy("serial", ds.decode_serial))
    with edgellm.load(converted("llama", "q4_1"), threads=2) as llm:
        m = llm.model
        counts = iter(range(100))
        monkeypatch.setattr(warmup, "compiled", lambda: next(counts))
        m.warmup(variants=False)
        assert m.variants_due and "serial" not in calls
        monkeypatch.setattr("edgellm.commands.common.say", lambda line: None)
        finish_first_run(llm)
        assert "serial" in calls and not m.variants_due and len(m.tokens) == 0
        calls.clear()
        finish_first_run(llm)  # nothing due: nothing runs
        assert calls == []


def test_warmup_loads_what_the_first_prompt_runs(converted, monkeypatch):
    """tokens (the first prompt's length): one token runs through the step where warmup
    loads it (no chunk), else as a one-token chunk; longer prompts as chunks of two."""
    from edgellm.arch.base import Transformer

    sizes = []
    monkeypatch.setattr(Transformer, "warm_chunk", lambda self, n: sizes.append(n))
    with edgellm.load(converted("llama", "q4_1"), threads=1) as llm:
        m = llm.model
        for tokens, decode, want in ((1, True, []), (1, False, [1]), (5, True, [2]),
                                     (5, False, [2])):
            sizes.clear()
            m.warmup(variants=False, decode=decode, tokens=tokens)
            assert sizes == want, (tokens, decode)


def test_generate_warms_up_for_its_prompt(converted, monkeypatch, capsys):
    """The CLI's generate tells the warmup its prompt's length (open_model's first_tokens)."""
    from edgellm import cli
    from edgellm.arch.base import Transformer
    from edgellm.commands import first_run

    monkeypatch.setattr(first_run, "worth_it", lambda: False)  # no child process here
    seen = []
    warm = Transformer.warmup
    monkeypatch.setattr(Transformer, "warmup",
                        lambda self, *a, **k: (seen.append(k.get("tokens")), warm(self, *a, **k)))
    path = str(converted("llama", "q4_1"))
    assert cli.main(["generate", "-m", path, "-p", "Hello there", "-n", "1", "-t", "1",
                     "--temp", "0"]) == 0
    with edgellm.load(path) as llm:
        assert seen[:1] == [len(llm.encode_prompt("Hello there"))]
