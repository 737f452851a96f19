"""The server's limits against a hostile but ordinary client (issue 49): a prompt beyond the
context or --max-prompt-tokens (400 context_length_exceeded, or truncated when asked), a
departed client's prefill, prefill shared fairly between prompts, a Content-Length over the
limit, a lone surrogate in embeddings. SmolLM2-135M in-process on a loopback port."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from conftest import FIXTURES  # noqa: E402
from server_helpers import ThreadServer, request  # noqa: E402

import edgellm  # noqa: E402

CONTEXT = 1024
ASK = [{"role": "user", "content": "What is the capital of France?"}]
FOX = "The quick brown fox jumps over the lazy dog. "  # 10 tokens


@pytest.fixture(scope="module")
def llm(smollm2):
    with edgellm.load(smollm2, context=CONTEXT) as model:
        model.model.warmup()
        yield model


@pytest.fixture(scope="module")
def llm_long(smollm2):
    """A context long enough for a prompt of many chunks (a departed client's)."""
    with edgellm.load(smollm2, context=4096) as model:
        yield model


@pytest.fixture(scope="module")
def server(llm):
    s = ThreadServer(llm, parallel=2)
    yield s
    s.stop()


def _tools(n: int, enum: int = 0) -> list[dict]:
    prop = {"type": "string"} if not enum else {"enum": [f"v{i}" for i in range(enum)]}
    return [{"type": "function", "function": {
        "name": f"f{i}", "description": "a tool",
        "parameters": {"type": "object", "properties": {"a": prop}}}} for i in range(n)]


OVER_LONG = {  # each far beyond the 1024-token context
    "text": dict(messages=[{"role": "user", "content": FOX * 300}]),
    "huge": dict(messages=[{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": [{"type": "text", "text": FOX * 16000}]}]),
    "nul": dict(messages=[{"role": "user", "content": "\x00" * 5000}]),
    # 1,000 tools: 2,000 pass the constraints' schema-size limit (a 400 naming `tools` first)
    "tools": dict(messages=ASK, tools=_tools(1000)),
    "enum": dict(messages=ASK, tools=_tools(1, enum=20000)),
}


@pytest.mark.parametrize("case", list(OVER_LONG))
def test_a_prompt_beyond_the_context_is_refused_before_any_prefill(server, case):
    """Once accepted and prefilled through context shifts, for minutes; now 400 with
    OpenAI's code, at once, nothing prefilled."""
    batch = server.app.state.batch
    passes = batch.prefill_passes
    c = server.client().with_options(timeout=30)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="smollm2", max_tokens=4, **OVER_LONG[case])
    err = e.value.body
    assert e.value.code == "context_length_exceeded" and err["param"] == "messages", err
    assert f"maximum context length is {CONTEXT} tokens" in err["message"]
    assert "truncate_prompt_tokens" in err["message"]
    assert batch.prefill_passes == passes
    if case == "huge":  # 720 KB: refused from its size, before it is tokenized
        assert "is at least" in err["message"]


def test_a_completion_prompt_beyond_the_context_is_refused(server):
    c = server.client().with_options(timeout=30)
    for prompt in (FOX * 200, FOX * 16000, [1] * (CONTEXT + 5), [1] * CONTEXT):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="smollm2", prompt=prompt, max_tokens=2)
        assert e.value.code == "context_length_exceeded" and e.value.body["param"] == "prompt"
    # the longest prompt that leaves room for an answer is served
    r = c.completions.create(model="smollm2", prompt=[1] * (CONTEXT - 1), max_tokens=1)
    assert r.usage.prompt_tokens == CONTEXT - 1


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(server, llm):
    c = server.client().with_options(timeout=60)
    long = [{"role": "user", "content": FOX * 300}]
    r = c.chat.completions.create(model="smollm2", messages=long, max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": 100})
    assert r.usage.prompt_tokens == 100
    r = c.chat.completions.create(model="smollm2", messages=long, max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": -1})
    assert r.usage.prompt_tokens == CONTEXT - 1  # as many as fit
    r = c.completions.create(model="smollm2", prompt=FOX * 200, max_tokens=2,
                             extra_body={"truncate_prompt_tokens": 50})
    assert r.usage.prompt_tokens == 50
    # a short prompt is left whole
    r = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=1,
                                  extra_body={"truncate_prompt_tokens": 500})
    assert r.usage.prompt_tokens == len(llm.encode_prompt(ASK))
    for bad in (0, -2, "x"):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=1,
                                      extra_body={"truncate_prompt_tokens": bad})
        assert e.value.body["param"] == "truncate_prompt_tokens", e.value.body


def test_max_prompt_tokens_bounds_a_prompt_template_and_tools_included(llm):
    s = ThreadServer(llm, parallel=1, max_prompt_tokens=120)
    try:
        c = s.client().with_options(timeout=30)
        n = len(llm.encode_prompt(ASK))
        assert n < 120
        r = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=1)
        assert r.usage.prompt_tokens == n
        # the same question with a tool: the tools' system message takes it past 120
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=1,
                                      tools=_tools(3))
        err = e.value.body
        assert e.value.code == "context_length_exceeded" and "at most 120" in err["message"]
        assert "--max-prompt-tokens" in err["message"]
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="smollm2", prompt=FOX * 13, max_tokens=1)
        assert "at most 120" in e.value.body["message"]
        r = c.completions.create(model="smollm2", prompt=FOX * 13, max_tokens=1,
                                 extra_body={"truncate_prompt_tokens": -1})
        assert r.usage.prompt_tokens == 120
    finally:
        s.stop()


def test_prefill_shares_are_max_min_fair():
    from edgellm.batch import _shares

    assert _shares([10, 500, 500], 128) == [10, 59, 59]
    assert _shares([5000], 128) == [128]
    assert _shares([3, 4], 128) == [3, 4]
    assert _shares([100, 100, 100], 128) == [43, 43, 42]
    assert _shares([], 128) == [] and _shares([7], 0) == [0]
    assert sum(_shares([1000] * 7, 128)) == 128


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_short_question_does_not_wait_for_a_long_prompt(server, llm):
    """Prompts waiting together share each round's chunk (their decode rows between): a
    one-line question that arrives while a 900-token prompt is being prefilled is answered
    within three prefill rounds, the long prompt still going (in arrival order it waited for
    all of that prompt, a round per chunk)."""
    batch = server.app.state.batch
    c = server.client().with_options(timeout=120)
    long = [{"role": "user", "content": "Summarize: " + FOX * 88}]
    n_long = len(llm.encode_prompt(long))
    assert 6 * batch.model.chunk < n_long < CONTEXT
    done: dict = {}

    def ask(name, messages):
        c.chat.completions.create(model="smollm2", messages=messages, max_tokens=1)
        done[name] = batch.prefill_rounds

    start = batch.prefill_rounds
    t = threading.Thread(target=ask, args=("long", long))
    t.start()
    _wait(lambda: batch.prefill_rounds > start)  # the long prompt's first chunk has run
    asked = batch.prefill_rounds
    ask("short", ASK)
    t.join()
    assert done["short"] - asked <= 3, (done, asked, start)
    assert done["long"] - done["short"] >= 2, (done, asked, start)


def test_beside_a_stream_a_long_prompt_is_prefilled_in_quarter_chunks(server, llm):
    """A round that decodes a stream prefills at most a quarter of the chunk (the stream's
    next token waits for that round's prefill): a 900-token prompt arriving mid-stream takes
    about four times the rounds whole chunks would."""
    batch = server.app.state.batch
    c = server.client().with_options(timeout=120)
    stream = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=300,
                                       stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    next(it)
    mixed, prefilled = batch.mixed, batch.prefilled
    long = [{"role": "user", "content": "Repeat this: " + FOX * 88}]  # in no slot's cache
    c.chat.completions.create(model="smollm2", messages=long, max_tokens=1)
    stream.close()
    whole = (batch.prefilled - prefilled) // batch.model.chunk
    assert whole >= 6
    assert batch.mixed - mixed >= 2.5 * whole, (batch.mixed - mixed, whole)


def _idle(s) -> None:
    _wait(lambda: json.loads(request(s.url + "/health")[2])["slots_busy"] == 0)


@pytest.mark.parametrize("how", ["stream", "timeout"])
def test_a_departed_clients_prefill_stops_at_its_next_chunk(llm_long, how):
    """A client that leaves while its long prompt is prefilled (closing its stream, or its
    timeout) stops the prefill at the next chunk, as its decode does at the next token
    (the engine prefilled the whole prompt for no one)."""
    s = ThreadServer(llm_long, parallel=1)
    try:
        batch = s.app.state.batch
        long = [{"role": "user", "content": "Summarize: " + FOX * 380}]
        n = len(llm_long.encode_prompt(long))
        assert 3500 < n < 4095
        start = batch.prefill_passes  # a chunk a pass here (one slot)
        if how == "stream":
            stream = s.client().chat.completions.create(model="smollm2", messages=long,
                                                        max_tokens=4, stream=True)
            _wait(lambda: batch.prefill_passes > start)
            stream.close()
        else:
            with pytest.raises(openai.APITimeoutError):
                s.client().with_options(timeout=0.3).chat.completions.create(
                    model="smollm2", messages=long, max_tokens=4)
        _idle(s)
        chunks = batch.prefill_passes - start
        assert chunks * batch.model.chunk < n / 2, (chunks, n)
        # the slot serves the next request (its cache as far as it was prefilled)
        r = s.client().chat.completions.create(model="smollm2", messages=ASK, max_tokens=2)
        assert r.usage.completion_tokens >= 1
    finally:
        s.stop()


def _raw(port: int, head: bytes, timeout: float = 5.0) -> bytes:
    """What the server answers to `head` (a request's head, its body not sent) within
    `timeout` (b"" if nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        got = b""
        try:
            while b"\r\n\r\n" not in got:
                part = sock.recv(65536)
                if not part:
                    break
                got += part
        except TimeoutError:
            pass
        return got


@pytest.mark.parametrize("expect", [False, True])
def test_a_content_length_over_the_limit_is_413_at_once(server, expect):
    """The 413 comes before the body (it waited for the body to drain)."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n" +
            (b"Expect: 100-continue\r\n" if expect else b"") + b"\r\n")
    t = time.monotonic()
    got = _raw(server.port, head, timeout=5)
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    assert time.monotonic() - t < 2
    assert request(server.url + "/health")[0] == 200


def test_a_content_length_over_the_limit_then_the_body_still_gets_413(server):
    """A client that sends its body anyway (not waiting for an answer) still reads the 413,
    and a 2 MiB body refused is not kept."""
    big = json.dumps({"model": "smollm2", "messages": [
        {"role": "user", "content": "x" * (2 << 20)}]}).encode()
    status, _, raw = request(server.url + "/v1/chat/completions", big)
    assert status == 413 and json.loads(raw)["error"]["code"] == "request_too_large"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    out = tmp_path_factory.mktemp("bert") / "bert-tiny.edgellm"
    convert(open_hf(FIXTURES / "embed" / "bert-tiny"), out, "f32", progress=False)
    with edgellm.load(out) as model:
        yield model


@pytest.mark.parametrize("body", [
    '{"model": "bert-tiny", "input": "a \\ud800 b"}',
    '{"model": "bert-tiny", "input": ["fine", "\\udfff"]}',
    '{"model": "bert-tiny", "input": "\\ud83d"}',
])
def test_a_lone_surrogate_in_embeddings_input_is_400(llm, bert, body):
    s = ThreadServer(llm, bert, parallel=1, embedding_id="bert-tiny")
    try:
        status, _, raw = request(s.url + "/v1/embeddings", body.encode())
        err = json.loads(raw)["error"]
        assert status == 400 and err["param"] == "input", (status, err)
        assert "not valid Unicode" in err["message"] and "input" in err["message"]
        status, _, _ = request(s.url + "/v1/embeddings", {"model": "bert-tiny", "input": "ok"})
        assert status == 200
    finally:
        s.stop()
