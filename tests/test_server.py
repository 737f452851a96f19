"""`edgellm serve` driven by the official openai client: SmolLM2-135M on a loopback port
(in-process), the tiny BERT for embeddings, every error status, batch invariance."""

from __future__ import annotations

import json
import threading
import urllib.error

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from conftest import FIXTURES  # noqa: E402
from server_helpers import ThreadServer, request  # noqa: E402

import edgellm  # noqa: E402

BERT = FIXTURES / "embed" / "bert-tiny"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def llm(smollm2):
    with edgellm.load(smollm2, context=1024) as model:
        model.model.warmup()
        yield model


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    out = tmp_path_factory.mktemp("bert") / "bert-tiny.edgellm"
    convert(open_hf(BERT), out, "f32", progress=False)
    with edgellm.load(out) as model:
        yield model


@pytest.fixture(scope="module")
def server(llm, bert):
    s = ThreadServer(llm, bert, parallel=4, embedding_id="bert-tiny", max_tokens=512)
    yield s
    s.stop()


def _hf_tokenizer(llm):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(llm.packed.tokenizer_json)


def test_models_and_health(server):
    c = server.client()
    assert [m.id for m in c.models.list().data] == ["smollm2", "bert-tiny"]
    status, _, body = request(server.url + "/health")
    assert status == 200 and json.loads(body)["slots"] == 4


def test_chat_completion_usage_is_the_tokenizers_count(server, llm):
    r = server.client().chat.completions.create(model="smollm2", messages=ASK, max_tokens=6,
                                                temperature=0)
    assert r.object == "chat.completion" and r.model == "smollm2"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    tok = _hf_tokenizer(llm)
    prompt = llm.apply_chat_template(ASK)
    assert r.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False).ids)
    assert r.usage.completion_tokens == 6 == len(tok.encode(choice.message.content,
                                                            add_special_tokens=False).ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6
    # the same answer as the Python API gives
    api = llm.create_chat_completion(ASK, max_tokens=6, temperature=0)
    assert choice.message.content == api["choices"][0]["message"]["content"]


def test_ignore_eos_runs_to_max_tokens(server, llm):
    """llama.cpp's ignore_eos: the end-of-sequence ids banned, so an answer that would end
    at once (its EOS pushed up by logit_bias) runs to max_tokens instead, as a stream too."""
    eos = sorted(llm.tokenizer.eos_ids)[0]
    c = server.client()
    kw = dict(model="smollm2", messages=ASK, max_tokens=5, temperature=0,
              logit_bias={str(eos): 100})
    r = c.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 0
    r = c.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    chunks = list(c.chat.completions.create(**kw, stream=True, extra_body={"ignore_eos": True},
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        r.choices[0].message.content
    r = c.completions.create(model="smollm2", prompt="The", max_tokens=4, temperature=0,
                             logit_bias={str(eos): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4


def test_stream_equals_the_whole_answer_and_ends_with_done(server):
    c = server.client()
    whole = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=12,
                                      temperature=0, stop=["\n\n"])
    chunks = list(c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=12,
                                            temperature=0, stop=["\n\n"], stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(ch.usage is None for ch in chunks[:-1])
    status, headers, raw = request(server.url + "/v1/chat/completions",
                                   {"model": "smollm2", "messages": ASK, "max_tokens": 3,
                                    "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = raw.decode().strip().split("\n\n")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert all("usage" not in json.loads(e[6:]) for e in events[:-1])


def test_tool_call(server):
    r = server.client().chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=WEATHER, tool_choice="required", max_tokens=64, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_json_schema_response_validates(server):
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = server.client().chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Invent a person."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema}},
        max_tokens=64, temperature=0)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_completions_endpoint(server, llm):
    c = server.client()
    r = c.completions.create(model="smollm2", prompt="The sky is", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.choices[0].text == llm.generate("The sky is", max_tokens=5, temperature=0)
    assert r.usage.prompt_tokens == len(llm.encode_prompt("The sky is"))
    assert r.usage.completion_tokens == 5
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="smollm2", prompt="The sky is", max_tokens=5, temperature=0, stream=True))
    assert streamed == r.choices[0].text


def test_embeddings_match_sentence_transformers_in_both_encodings(server, bert):
    sentences = json.loads((BERT / "cases.json").read_text())["sentences"][:3]
    with np.load(BERT / "reference.npz") as z:
        want = z["embeddings"][:3]
    c = server.client()
    r = c.embeddings.create(model="bert-tiny", input=sentences)  # the client asks for base64
    got = np.array([d.embedding for d in r.data], np.float32)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert r.usage.prompt_tokens == sum(len(i) for i in bert.embedder.tokenize(sentences))
    r = c.embeddings.create(model="bert-tiny", input=sentences[0], encoding_format="float")
    np.testing.assert_allclose(r.data[0].embedding, want[0], atol=2e-5)


def _error(server, path, body, headers=None):
    status, h, raw = request(server.url + path, body, headers)
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return status, err, h


@pytest.mark.parametrize("body, param", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 2}, "n"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
     "response_format"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"stop": [""]}, "stop"),
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),  # int() would take it, "1_0", "\u0663"
    ({"seed": -1}, "seed"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": "x"}]},
                   *ASK]}, "messages"),
    ({"tools": WEATHER, "tool_choice": {"type": "function", "function": "get_weather"}},
     "tool_choice"),
    ({"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    status, err, _ = _error(server, "/v1/chat/completions",
                            {"model": "smollm2", "messages": ASK, "max_tokens": 2, **body})
    assert status == 400 and err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    with pytest.raises(openai.BadRequestError):  # as the client sees it
        server.client().chat.completions.create(**{"model": "smollm2", "messages": ASK,
                                                   "max_tokens": 2, **body})


def test_bad_sampling_is_400_before_a_slot_or_a_stream(llm):
    """A value the sampler refuses is answered 400 when the request arrives: not a 200
    stream ending in an error event, nor a wait (or 503) while the slots are busy."""
    s = ThreadServer(llm, parallel=1, queue=0)
    try:
        busy = s.client().chat.completions.create(model="smollm2", messages=ASK,
                                                  max_tokens=200, stream=True)
        next(iter(busy))  # the only slot is taken and nothing may queue
        for path, body in (("/v1/chat/completions", {"messages": ASK}),
                           ("/v1/completions", {"prompt": "Hello"})):
            for bad in ({"temperature": -1}, {"top_p": 0}, {"seed": -1}):
                for stream in (False, True):
                    status, err, _ = _error(s, path, {"model": "smollm2", "max_tokens": 2,
                                                      "stream": stream, **body, **bad})
                    assert status == 400 and err["param"] == next(iter(bad)), (path, bad, err)
        with pytest.raises(openai.BadRequestError):
            s.client().chat.completions.create(model="smollm2", messages=ASK, stream=True,
                                               temperature=-1)
        busy.close()
    finally:
        s.stop()


def test_null_optional_fields_and_bad_json(server):
    body = {"model": "smollm2", "messages": ASK, "max_tokens": 2, "n": None, "stream": None,
            "ignore_eos": None, "parallel_tool_calls": None, "stream_options": None,
            "temperature": None, "logit_bias": None}
    status, _, raw = request(server.url + "/v1/chat/completions", body)
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["role"] == "assistant"
    status, err, _ = _error(server, "/v1/chat/completions", b'{"model": "smollm2", ')
    assert status == 400 and err["param"] is None and "JSON" in err["message"]


def test_unknown_model_is_404_and_a_large_body_413(server):
    status, err, _ = _error(server, "/v1/chat/completions", {"model": "gpt-4", "messages": ASK})
    assert status == 404 and err["code"] == "model_not_found" and err["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        server.client().embeddings.create(model="smollm2", input="x")
    big = {"model": "smollm2", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    status, err, _ = _error(server, "/v1/chat/completions", big)
    assert status == 413
    # the same body in chunks (no Content-Length): found too large while read, still 413
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        data = json.dumps(big).encode()
        conn.request("POST", "/v1/chat/completions", body=iter([data[i:i + 65536] for i in
                                                                range(0, len(data), 65536)]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        err = json.loads(r.read())["error"]
        assert r.status == 413 and err["code"] == "request_too_large", err
    finally:
        conn.close()
    status, err, _ = _error(server, "/v1/nothing", {})
    assert status == 404


def test_api_key_is_required_where_set(llm):
    s = ThreadServer(llm, api_key="sekrit", parallel=1)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, err, _ = _error(s, "/v1/models", None, headers)
            assert status == 401 and err["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert s.client().models.list().data[0].id == "smollm2"
        assert request(s.url + "/health")[0] == 200  # the health check stays open
    finally:
        s.stop()


def test_full_queue_is_503_with_retry_after(llm):
    s = ThreadServer(llm, parallel=1, queue=0)
    try:
        stream = s.client().chat.completions.create(model="smollm2", messages=ASK,
                                                    max_tokens=200, stream=True)
        next(iter(stream))  # the only slot is busy
        status, err, headers = _error(s, "/v1/chat/completions",
                                      {"model": "smollm2", "messages": ASK, "max_tokens": 2})
        assert status == 503 and headers["retry-after"] == "1" and err["code"] == "queue_full"
        stream.close()
    finally:
        s.stop()


def test_a_request_batched_with_others_answers_as_alone(server):
    """Greedy answers of four requests decoded in one batch equal each served alone."""
    c = server.client()
    # "What is the capital of France?" rides a near-tie (README, Precision): it once
    # flipped at its 11th token when the batched rows ran the per-operation kernels, whose
    # matrix products round a row differently with 1, 2-3 or 4 rows in the step. The
    # batched fused step computes every row as the fused step alone, bit for bit.
    prompts = ["What is the capital of France?", "Write a haiku about snow.",
               "Count from one to ten.", "Name three colors."]

    def ask(p):
        r = c.chat.completions.create(model="smollm2", max_tokens=20, temperature=0,
                                      messages=[{"role": "user", "content": p}])
        return r.choices[0].message.content

    alone = [ask(p) for p in prompts]
    batch = server.app.state.batch
    rounds, rows = batch.rounds, batch.rows
    together: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, ask(prompts[i])))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    shared = (batch.rows - rows) / (batch.rounds - rounds)
    assert shared > 1.5, f"{shared:.2f} rows per decode step"  # the rows did share steps


def test_a_conversation_goes_back_to_its_slot(server, llm):
    """The second turn of a chat is served by the slot that holds the first: only the new
    turn is prefilled."""
    c = server.client()
    first = [{"role": "user", "content": "Name a fruit."}]
    r = c.chat.completions.create(model="smollm2", messages=first, max_tokens=8, temperature=0)
    second = first + [{"role": "assistant", "content": r.choices[0].message.content},
                      {"role": "user", "content": "And a vegetable?"}]
    slots = server.app.state.batch.slots
    c.chat.completions.create(model="smollm2", messages=second, max_tokens=4, temperature=0)
    reused = max(s.prompt_cache.reused for s in slots)
    assert reused >= len(llm.encode_prompt(first)) - 1


def test_a_long_prompt_is_prefilled_between_the_decode_steps(server):
    """A prompt of several chunks, arriving while another request streams, is prefilled a
    chunk per round beside that stream's decode rows, not all at once before them."""
    c = server.client()
    batch = server.app.state.batch
    stream = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=30,
                                       temperature=0, stream=True)
    it = iter(stream)
    next(it)
    mixed = batch.mixed
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 18)  # ~200 tokens
    r = c.chat.completions.create(model="smollm2", max_tokens=1,
                                  messages=[{"role": "user", "content": long}])
    list(it)
    chunks = -(-r.usage.prompt_tokens // server.app.state.batch.model.chunk)
    assert batch.mixed - mixed >= chunks - 1


def _rows_when_free(s, rows0: int) -> int:
    """Rows the batch decoded since rows0, once /health shows no slot busy."""
    while json.loads(request(s.url + "/health")[2])["slots_busy"]:
        threading.Event().wait(0.05)
    return s.app.state.batch.rows - rows0


def test_a_client_gone_from_a_tool_stream_frees_its_slot(llm):
    """A stream with tools holds its text back until the end (the calls are parsed there),
    so it sends nothing for a while: a client that leaves meanwhile still ends it after the
    token in progress, not after max_tokens."""
    s = ThreadServer(llm, parallel=1)
    try:
        batch = s.app.state.batch
        rows = batch.rows
        stream = s.client().chat.completions.create(
            model="smollm2", messages=ASK, tools=WEATHER, tool_choice="auto", max_tokens=1000,
            temperature=0, stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the role chunk; then nothing until the end
        while batch.rows - rows < 8:  # generating
            threading.Event().wait(0.01)
        stream.close()
        assert _rows_when_free(s, rows) < 500  # not the 1000 asked for
    finally:
        s.stop()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_client_gone_before_a_whole_answer_frees_its_slot(llm, endpoint):
    """A non-streamed request whose client gives up (here its timeout) ends its generation
    soon after, rather than running to max_tokens on a slot for no one (the openai client,
    retrying on a timeout, would otherwise fill the slots with abandoned answers)."""
    s = ThreadServer(llm, parallel=1)
    try:
        batch = s.app.state.batch
        rows = batch.rows
        c = s.client().with_options(timeout=0.5)
        ask = dict(model="smollm2", max_tokens=1000, temperature=0,
                   extra_body={"ignore_eos": True})
        with pytest.raises(openai.APITimeoutError):
            if endpoint == "chat":
                c.chat.completions.create(messages=ASK, **ask)
            else:
                c.completions.create(prompt="Once upon a time", **ask)
        assert _rows_when_free(s, rows) < 500  # not the 1000 asked for
    finally:
        s.stop()


def test_cors_only_when_asked(llm, server):
    # the headers OpenAI's JavaScript client sends with its requests
    preflight = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type,"
                                                   "x-stainless-os,x-stainless-lang"}

    def allowed(s):
        import urllib.request

        req = urllib.request.Request(s.url + "/v1/chat/completions", method="OPTIONS",
                                     headers=preflight)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, headers = r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            status, headers = e.code, dict(e.headers)
        return status, headers.get("access-control-allow-origin")

    assert allowed(server)[1] is None
    s = ThreadServer(llm, parallel=1, cors=("http://example.com",))
    try:
        assert allowed(s) == (200, "http://example.com")
    finally:
        s.stop()


def test_serve_warns_on_a_public_address_without_a_key(tmp_path):
    import subprocess
    import sys

    from server_helpers import ROOT

    done = subprocess.run([sys.executable, "-m", "edgellm", "serve", "--host", "0.0.0.0",
                           "-m", str(tmp_path / "missing.edgellm")], capture_output=True,
                          text=True, cwd=ROOT, env={**__import__("os").environ,
                                                    "PYTHONPATH": str(ROOT)}, timeout=120)
    assert "warning: serving on 0.0.0.0 without --api-key" in done.stderr
    assert done.returncode == 1 and "Traceback" not in done.stderr


def test_serve_refuses_an_address_it_cannot_bind_before_loading(tmp_path):
    """An address in use or an unknown host: one line naming it and why, before the model
    loads (the model here does not even exist), not uvicorn's log and a guess."""
    import subprocess
    import sys

    from server_helpers import ROOT, free_socket

    taken = free_socket()
    taken.listen()
    try:
        for where in (["--port", str(taken.getsockname()[1])],
                      ["--host", "no-such-host.invalid", "--api-key", "k"]):
            done = subprocess.run([sys.executable, "-m", "edgellm", "serve", *where,
                                   "-m", str(tmp_path / "missing.edgellm")],
                                  capture_output=True, text=True, cwd=ROOT, timeout=120,
                                  env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 1 and len(lines) == 1, done.stderr
            assert lines[0].startswith("edgellm: error: cannot serve on "), lines
    finally:
        taken.close()
