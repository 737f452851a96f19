"""The API's and the CLI's edges: chat templates bounded in time whatever construct they use,
and bad arguments ending in a typed error (API) or one line with exit code 1 or 2 (CLI)."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_robustness import assert_error_line, rewrite, run_cli

import edgellm
from edgellm.cli import main as edgellm_main
from edgellm.errors import ArgumentError, EdgeLLMError, TemplateError
from edgellm.text.chat_template import ChatTemplate

sys.path.insert(0, str(Path(__file__).parent))

# ------------------------------------------------------------------- template time limits

R = "{% set r = range(100000) %}"
SLOW_TEMPLATES = {
    # loops over a range in a variable pass no attribute, call or filter: no check before
    "nested loops": R + "{% for a in r %}{% for b in r %}{% for c in r %}{% for d in r %}"
                        "{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
    "loop filter": R + "{% for a in r %}{% for b in r if b < 0 %}{% endfor %}{% endfor %}",
    "macro fan-out": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                     "{% endmacro %}{{ f(40) }}",
    "call blocks": "{% macro g() %}{{ caller() }}{{ caller() }}{% endmacro %}"
                   "{% macro f(n) %}{% if n %}{% call g() %}{{ f(n - 1) }}{% endcall %}"
                   "{% endif %}{% endmacro %}{{ f(40) }}",
    "filters on large ranges": R + "{% for a in r %}{% set x = r|map('string')|join %}"
                                   "{% endfor %}",
    "string multiplication": R + "{% for a in r %}{% for b in r %}{% set x = 'ab' * 400000 %}"
                                 "{% endfor %}{% endfor %}",
    "sorting": R + "{% for a in r %}{% set x = r|list|sort(reverse=true) %}{% endfor %}",
}


def slack() -> float:
    """Seconds a render may run past its limit: 1 s (the issue's bound) on a machine with a
    core per runnable process, scaled by the oversubscription when other jobs share it (the
    step between two deadline checks then takes longer in wall time, not in work)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@pytest.mark.parametrize("name", sorted(SLOW_TEMPLATES))
def test_template_time_limit_holds_for_every_construct(name):
    limit = 1.0
    t = ChatTemplate(SLOW_TEMPLATES[name], max_seconds=limit)
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="took longer than 1 s"):
        t.render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < limit + slack()


def test_squaring_a_large_int_is_refused():
    t = ChatTemplate("{% set a = 2**4000 %}{% set b = a * a %}{{ (b * b)|string|length }}")
    with pytest.raises(TemplateError, match="too large"):
        t.render([])


def test_nested_loop_template_in_a_model_file_ends_within_the_limit(converted, tmp_path):
    """What hung `edgellm generate --chat`: a four-level loop over a range in a variable,
    at the default limit (10 s)."""
    from edgellm.text.chat_template import MAX_SECONDS

    path = rewrite(converted("llama", "q8_0"), tmp_path / "t.edgellm",
                   lambda h: h.__setitem__("chat_template", SLOW_TEMPLATES["nested loops"]))
    with edgellm.load(path) as llm:
        t0 = time.monotonic()
        with pytest.raises(TemplateError, match=f"took longer than {MAX_SECONDS:g} s"):
            llm.apply_chat_template([{"role": "user", "content": "hi"}])
        assert time.monotonic() - t0 < MAX_SECONDS + slack()


def test_loop_checks_cannot_be_shadowed():
    """The check is an internal node: a template's own names do not reach it."""
    src = ("{% set loop_tick = false %}{% set environment = none %}" + R
           + "{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}")
    with pytest.raises(TemplateError, match="took longer"):
        ChatTemplate(src, max_seconds=0.5).render([])


# -------------------------------------------------------------------- API argument edges

@pytest.fixture(scope="module")
def llm(converted):
    with edgellm.load(converted("llama", "q8_0")) as m:
        yield m


API_CASES = [
    # (call, error class, words): each raised a raw TypeError/OverflowError or was silent
    (lambda m: m.generate("hi", stop=5), ArgumentError, "stop must be a str"),
    (lambda m: m.generate("hi", stop=b"x"), ArgumentError, "stop must be a str"),
    (lambda m: m.generate("hi", stop=[""]), ArgumentError, "must not be empty"),
    (lambda m: m.generate(None), ArgumentError, "got NoneType"),
    (lambda m: m.generate(b"hi"), ArgumentError, "decode bytes"),
    (lambda m: m.generate([2**63]), ArgumentError, "outside the vocabulary"),
    (lambda m: m.logits([2**63]), ArgumentError, "outside the vocabulary"),
    (lambda m: m.logits([1.7, 2.2]), ArgumentError, "must be ints, got float"),
    (lambda m: m.logits(np.array([1.0, 2.0])), ArgumentError, "1-D array of integers"),
    (lambda m: m.generate([1.0, 2.0]), ArgumentError, "must be ints, got float"),
    (lambda m: m.generate([True, 2]), ArgumentError, "must be ints, got bool"),
    (lambda m: m.generate("a\udcffb"), ArgumentError, "not valid Unicode"),
    (lambda m: m.generate([{"role": "user", "content": "a\udcffb"}]), ArgumentError,
     "not valid Unicode"),
    (lambda m: m.generate("hi", shift="no"), ArgumentError, "shift must be True or False"),
    (lambda m: m.generate("hi", timeout=-1), ArgumentError, "timeout must be"),
    (lambda m: m.chat().ask(b"hi"), ArgumentError, "message must be a str"),
    (lambda m: m.apply_chat_template("hi"), ArgumentError, "messages must be a list"),
]


@pytest.mark.parametrize("case", range(len(API_CASES)))
def test_bad_api_arguments_are_typed(case, llm):
    call, cls, words = API_CASES[case]
    with pytest.raises(cls, match=words) as e:
        call(llm)
    assert "\n" not in str(e.value)
    assert llm.generate("hi", max_tokens=2, temperature=0) is not None  # still usable


@pytest.mark.parametrize("kwargs,cls,words", [
    ({"path": None}, ArgumentError, "path must be a str"),
    ({"path": ""}, ArgumentError, "path is empty"),
    ({"path": 5}, ArgumentError, "path must be a str"),
    ({"threads": "2"}, ArgumentError, "threads must be an int"),
    ({"threads": 0}, ArgumentError, "threads must be >= 1"),
    ({"context": 4.5}, ArgumentError, "context must be an int"),
    ({"precise": "yes"}, ArgumentError, "precise must be True or False"),
    ({"act_type": "int4"}, ArgumentError, "act_type must be one of int16, int8, got str"),
    ({"act_type": None}, ArgumentError, "act_type must be one of int16, int8, got None"),
])
def test_bad_load_arguments_are_typed(kwargs, cls, words, converted):
    kwargs = {"path": converted("llama", "q8_0"), **kwargs}
    with pytest.raises(cls, match=words):
        edgellm.load(**kwargs)


def test_context_beyond_the_model_warns(converted):
    """Allowed in the API (the converter calibrates tiny models at 512), with a word."""
    from edgellm.errors import ContextWarning

    with pytest.warns(ContextWarning, match="beyond the model's max_position_embeddings"):
        edgellm.load(converted("llama", "q8_0"), context=300).close()


def test_argument_error_is_also_a_type_and_value_error():
    assert issubclass(ArgumentError, EdgeLLMError)
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, ValueError)


# -------------------------------------------------------------------- CLI argument edges

def test_ctx_beyond_the_model_is_one_line(converted, capsys):
    """Was `internal error: OSError: [Errno 12] Cannot allocate memory`."""
    path = converted("llama", "q8_0")
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", path, "--ctx", "100000000",
                                        "-p", "hi"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", "context must be in 8..16777216")
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", path, "--ctx", "100000",
                                        "-p", "hi"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", "max_position_embeddings of 256")


def test_ctx_allocation_failure_is_one_line(converted, monkeypatch, capsys):
    """A model whose positions allow the context but the machine has not the memory."""
    import errno

    from edgellm import arch

    def no_memory(*a, **k):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(arch, "build", no_memory)
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", converted("llama", "q8_0"),
                                        "-p", "hi"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", "not enough memory")


@pytest.mark.parametrize("argv,words", [
    (["-p", "a\udcffb"], "argument -p/--prompt: the prompt is not valid UTF-8"),
    (["-p", "hi", "--stop", ""], "argument --stop: a stop string must not be empty"),
    (["-p", "hi", "--system", "\udcff", "--chat"], "argument --system"),
    (["-p", "hi", "--act-type", "int4"], "argument --act-type: invalid choice: 'int4'"),
])
def test_bad_cli_text_is_a_usage_error(argv, words, converted, capsys):
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", converted("llama", "q8_0"), *argv],
                         capsys)
    assert rc == 2 and words in err and "Traceback" not in err, err


def test_empty_model_name_is_a_usage_error(capsys):
    """Was: pulled the default model."""
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", "", "-p", "hi"], capsys)
    assert rc == 2 and "model name or path must not be empty" in err, err




def test_invalid_utf8_on_stdin_is_one_line(converted, capsys, monkeypatch):
    """Was `internal error: TypeError: TextInputSequence must be str`."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab\xffcd")))
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", converted("llama", "q8_0"),
                                        "-p", "-", "-n", "2"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", "stdin is not valid UTF-8: byte 0xff at offset 2")


def test_invalid_utf8_in_a_chat_line_is_one_line(converted, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab\xffcd\n"),
                                                       errors="surrogateescape"))
    rc, _, err = run_cli(edgellm_main, ["chat", "-m", converted("llama", "q8_0"), "-n", "2"],
                         capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", "message is not valid Unicode")
