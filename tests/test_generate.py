"""Generation: the Python API, the CLI, stop strings, seeds and chat sessions."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import reference

import edgellm
from edgellm.errors import SamplingError
from edgellm.generate import StopMatcher


@pytest.fixture(scope="module")
def llm(converted):
    with edgellm.load(converted("qwen2", "q8_0")) as m:
        yield m


def test_greedy_stream_equals_reference(converted):
    ref = reference("llama")
    with edgellm.load(converted("llama", "f32")) as m:
        chunks = list(m.stream(list(ref["input_ids"]), max_tokens=24, temperature=0))
        ids = [c.token for c in chunks if c.token is not None]
        assert "".join(c.text for c in chunks) == m.tokenizer.decode(ids)
    assert ids == list(ref["greedy_ids"])
    last = chunks[-1]
    assert last.finish_reason == "length"
    assert last.stats.prompt_tokens == 40 and last.stats.generated_tokens == 24


def test_prompt_forms(llm):
    text = "def f(x):"
    ids = llm.tokenizer.encode(text, add_special_tokens=True)
    a = llm.generate(text, max_tokens=8, temperature=0)
    b = llm.generate(ids, max_tokens=8, temperature=0)
    assert a == b
    msgs = [{"role": "user", "content": "hi"}]
    c = llm.generate(msgs, max_tokens=8, temperature=0)
    d = llm.generate(llm.apply_chat_template(msgs), max_tokens=8, temperature=0)
    assert c == d
    assert llm.apply_chat_template(msgs) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_seed_repeats_and_differs(llm):
    kw = dict(max_tokens=16, temperature=1.0, top_k=40)
    assert llm.generate("x = ", seed=7, **kw) == llm.generate("x = ", seed=7, **kw)
    outs = {llm.generate("x = ", seed=s, **kw) for s in range(4)}
    assert len(outs) > 1


def test_stop_string_cuts_exactly(llm):
    full = llm.generate("import ", max_tokens=24, temperature=0)
    stop = full[5:8]
    assert stop and full.find(stop) >= 0
    cut = llm.generate("import ", max_tokens=24, temperature=0, stop=[stop])
    assert cut == full[:full.find(stop)]


def test_the_stop_string_that_ended_it_is_told(llm):
    """The last chunk names the stop string reached (the first in the text), so that an API
    can say which (Anthropic's stop_sequence, vLLM's stop_reason); an end by length or by
    end of sequence names none."""
    full = llm.generate("import ", max_tokens=24, temperature=0)
    first, later = full[3:5], full[9:12]
    chunks = list(llm.stream("import ", max_tokens=24, temperature=0, stop=[later, first]))
    assert chunks[-1].finish_reason == "stop" and chunks[-1].stop == first
    assert list(llm.stream("import ", max_tokens=4, temperature=0))[-1].stop is None
    msgs = [{"role": "user", "content": "hi"}]
    r = llm.create_chat_completion(msgs, max_tokens=24, temperature=0)
    said = r["choices"][0]["message"]["content"]
    assert "stop_reason" not in r["choices"][0]
    stop = said[2:4]
    r = llm.create_chat_completion(msgs, max_tokens=24, temperature=0, stop=[stop])
    assert r["choices"][0]["stop_reason"] == stop
    last = list(llm.create_chat_completion(msgs, max_tokens=24, temperature=0, stop=[stop],
                                           stream=True))[-1]
    assert last["choices"][0]["stop_reason"] == stop


@pytest.mark.parametrize("stops,pieces,want", [
    (["END"], ["abc E", "N", "D tail"], "abc "),
    (["END"], ["abc EN", "X"], "abc ENX"),
    (["\n\n", "##"], ["a\n", "#b", "\n", "\nc"], "a\n#b"),
    ([], ["a", "b"], "ab"),
])
def test_stop_matcher_across_chunks(stops, pieces, want):
    m = StopMatcher(stops)
    out, stopped = "", False
    for p in pieces:
        text, stopped = m.feed(p)
        out += text
        if stopped:
            break
    if not stopped:
        out += m.flush()
    assert out == want


def test_eos_stops_generation(llm):
    eos = next(iter(llm.tokenizer.eos_ids))
    chunks = list(llm.stream("a", max_tokens=50, temperature=0, logit_bias={eos: 100.0}))
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].stats.generated_tokens == 0


def test_bad_sampling_values(llm):
    for kw, name in ((dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
                     (dict(max_tokens=-2), "max_tokens"), (dict(top_k=1.5), "top_k"),
                     (dict(logit_bias={10**6: 1.0}), "logit_bias"), (dict(foo=1), "foo")):
        with pytest.raises(SamplingError, match=name):
            llm.generate("a", **kw)


def test_context_end_without_shift(converted):
    with edgellm.load(converted("llama", "q8_0"), context=16) as m:
        chunks = list(m.stream([1, 2, 3], max_tokens=100, temperature=0, shift=False))
        assert chunks[-1].finish_reason == "length"
        assert chunks[-1].stats.generated_tokens <= 14
        with pytest.raises(edgellm.EdgeLLMError, match="does not fit the context"):
            list(m.stream(list(range(5, 30)), shift=False))
        # with shifting (the default) generation runs on past the context
        chunks = list(m.stream([1, 2, 3], max_tokens=40, temperature=0))
        assert chunks[-1].stats.generated_tokens == 40


def test_three_turn_chat_prefills_only_new_tokens(llm):
    chat = llm.chat(system="be brief")
    counts, chat_text = [], ""  # chat_text: what the cache held after the previous turn
    for msg in ("hello", "and then?", "thanks"):
        before = len(llm.model.tokens)
        chat.ask(msg, max_tokens=6, temperature=0)
        counts.append(chat.last_prefill_tokens)
        full = llm.tokenizer.encode(llm.apply_chat_template(chat.messages[:-1]))
        if len(counts) > 1:
            # only the text after what the cache held: the end of the last answer, the new
            # user message and the assistant header
            new_text = llm.apply_chat_template(chat.messages[:-1])[len(chat_text):]
            assert counts[-1] == len(llm.tokenizer.encode(new_text))
            assert counts[-1] < len(full) - before + 3
        chat_text = llm.tokenizer.decode(llm.model.tokens)
    assert counts[0] == len(llm.tokenizer.encode(llm.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])))
    assert counts[1] < counts[0] + 8 and counts[2] < counts[0] + 8
    chat.reset()
    assert llm.model.tokens == [] and chat.messages == [{"role": "system", "content": "be brief"}]


def test_chat_answers_equal_fresh_generation(converted):
    """Turn two with the kept cache gives the same answer as a fresh run over the same ids."""
    with edgellm.load(converted("qwen2", "f32")) as m:
        chat = m.chat()
        chat.ask("one", max_tokens=5, temperature=0)
        held = len(m.model.tokens)
        second = chat.ask("two", max_tokens=5, temperature=0)
        prompt = m.model.tokens[:held + chat.last_prefill_tokens]
        assert m.generate(prompt, max_tokens=5, temperature=0) == second


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "edgellm", *args], capture_output=True,
                          text=True, input=stdin, timeout=300)


def test_cli_act_type_int8_answers_as_the_api(converted):
    """--act-type int8 (llama.cpp's activations) reaches the model: greedy text as the API's
    load(act_type="int8") gives it."""
    model = str(converted("llama", "q4_1"))
    got = run_cli("generate", "-m", model, "-p", "The", "-n", "8", "--temp", "0",
                  "--act-type", "int8")
    assert got.returncode == 0, got.stderr
    with edgellm.load(model, act_type="int8") as llm:
        assert llm.model.act_dtype == np.int8
        want = llm.generate("The", max_tokens=8, temperature=0)
    assert got.stdout.strip() == want.strip()


def test_cli_generate_streams_and_repeats_with_seed(converted):
    model = str(converted("qwen2", "q8_0"))
    a = run_cli("generate", "-m", model, "-p", "def ", "-n", "12", "--seed", "3",
                "--temp", "0.8", "--verbose")
    b = run_cli("generate", "-m", model, "-p", "def ", "-n", "12", "--seed", "3",
                "--temp", "0.8")
    assert a.returncode == 0 and b.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.strip()
    assert "tok/s" in a.stderr


def test_cli_stop_and_stdin(converted):
    model = str(converted("qwen2", "q8_0"))
    full = run_cli("generate", "-m", model, "-p", "-", "-n", "20", "--temp", "0",
                   stdin="import ").stdout.rstrip("\n")
    stop = full[4:7]
    cut = run_cli("generate", "-m", model, "-p", "-", "-n", "20", "--temp", "0", "--stop",
                  stop, stdin="import ").stdout.rstrip("\n")
    assert cut == full[:full.find(stop)]


def test_cli_chat_repl(converted):
    model = str(converted("qwen2", "q8_0"))
    r = run_cli("chat", "-m", model, "-n", "4", "--temp", "0", "--verbose",
                stdin="hello\n/help\n/reset\nagain\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert "conversation reset" in r.stderr and "/reset" in r.stderr
    assert r.stderr.count("prefilled") == 2


def test_cli_errors(converted, tmp_path):
    r = run_cli("generate", "-m", str(tmp_path / "none.edgellm"), "-p", "x")
    assert r.returncode == 1 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("generate", "-m", str(converted("qwen2", "q8_0")), "-p", "x", "--top-p", "2")
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("generate", "--bogus")
    assert r.returncode == 2
