"""`edgellm serve`'s Anthropic Messages API driven by the official anthropic client:
SmolLM2-135M on a loopback port (in-process, behind an API key the client sends as
x-api-key), and a tiny thinking model for thinking blocks. The client validates every
response against its own types (strict); the raw JSON's keys are checked against them too,
so that an extra field is noticed."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
anthropic = pytest.importorskip("anthropic")

import test_server  # noqa: E402
import test_tool_calls  # noqa: E402
from anthropic import types as at  # noqa: E402
from server_helpers import ThreadServer, request  # noqa: E402

from edgellm.chat_completion import plan_chat_completion  # noqa: E402

llm = test_server.llm  # the fixtures: SmolLM2 (warmed up), a tiny model that thinks (<think>)
hermes_llm = test_tool_calls.hermes_llm
TOOLS = test_tool_calls.TOOLS
KEY = "sk-test"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a geography teacher."
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
OPENAI_WEATHER = test_server.WEATHER  # the same tool in OpenAI's shape
T0 = {"temperature": 0}  # sampling fields as extra_body: the newest clients dropped them
BLOCKS = {"text": at.TextBlock, "tool_use": at.ToolUseBlock, "thinking": at.ThinkingBlock}


@pytest.fixture(scope="module")
def server(llm):
    s = ThreadServer(llm, parallel=2, max_tokens=512, api_key=KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return _client(server)


def _client(server, key=KEY):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120,
                               _strict_response_validation=True)


def _check_keys(raw: dict, model=at.Message) -> None:
    """Every key of a raw message (its blocks and usage too) is a field of the SDK's type."""
    assert set(raw) <= set(model.model_fields), set(raw) - set(model.model_fields)
    if model is at.Message:
        assert set(raw["usage"]) <= set(at.Usage.model_fields)
        for block in raw["content"]:
            _check_keys(block, BLOCKS[block["type"]])


EVENTS = {"message_start": at.RawMessageStartEvent, "message_delta": at.RawMessageDeltaEvent,
          "message_stop": at.RawMessageStopEvent,
          "content_block_start": at.RawContentBlockStartEvent,
          "content_block_delta": at.RawContentBlockDeltaEvent,
          "content_block_stop": at.RawContentBlockStopEvent}
MESSAGE_DELTA = at.RawMessageDeltaEvent.model_fields["delta"].annotation
DELTAS = {"text_delta": at.TextDelta, "thinking_delta": at.ThinkingDelta,
          "input_json_delta": at.InputJSONDelta}


def _raw_events(url: str, body: dict, key: str = KEY) -> list[dict]:
    """The events of a raw stream, each named as its data's type and its keys (nested too)
    fields of the SDK's types: message_start, ping, ..., message_stop."""
    status, headers, raw = request(url + "/v1/messages", {**body, "stream": True},
                                   {"x-api-key": key})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in raw.decode()
    events = []
    for part in raw.decode().strip().split("\n\n"):
        head, data = part.split("\n")
        assert head.startswith("event: ") and data.startswith("data: ")
        e = json.loads(data[6:])
        assert e["type"] == head[7:]
        events.append(e)
        if e["type"] == "ping":
            assert e == {"type": "ping"}
            continue
        _check_keys(e, EVENTS[e["type"]])
        inner = {"message_start": {"message": at.Message},
                 "message_delta": {"delta": MESSAGE_DELTA, "usage": at.MessageDeltaUsage},
                 "content_block_start": {"content_block": BLOCKS.get(
                     e.get("content_block", {}).get("type"))},
                 "content_block_delta": {"delta": DELTAS.get(e.get("delta", {}).get("type"))},
                 }.get(e["type"], {})
        for name, model in inner.items():
            _check_keys(e[name], model)
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    return events


def _created(client, **kwargs) -> at.Message:
    """messages.create's Message, the raw JSON's keys checked."""
    raw = client.messages.with_raw_response.create(**kwargs)
    _check_keys(raw.http_response.json())
    return raw.parse()


def _openai(system: str | None, messages: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + messages


def test_create_answers_as_the_python_api_does(client, llm):
    r = _created(client, model="smollm2", max_tokens=6, extra_body=T0, system=SYSTEM,
                 messages=ASK, metadata={"user_id": "u1"},
                 extra_headers={"anthropic-version": "2023-06-01"})
    assert isinstance(r, at.Message) and r.id.startswith("msg_") and r.model == "smollm2"
    assert r.role == "assistant" and r.type == "message"
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    api = llm.create_chat_completion(_openai(SYSTEM, ASK), max_tokens=6, temperature=0)
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == api["choices"][0]["message"]["content"]
    # Anthropic's input_tokens leave out those read from the prompt cache
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == \
        api["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == 6 and r.usage.cache_creation_input_tokens == 0
    # system as text blocks: the same prompt
    again = client.messages.create(model="smollm2", max_tokens=6, extra_body=T0, messages=ASK,
                                   system=[{"type": "text", "text": SYSTEM}])
    assert again.content[0].text == r.content[0].text
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == \
        api["usage"]["prompt_tokens"]


def test_stop_sequence_and_end_turn(client, llm):
    whole = client.messages.create(model="smollm2", max_tokens=12, extra_body=T0, messages=ASK)
    text = whole.content[0].text
    word = text.split()[2]
    r = _created(client, model="smollm2", max_tokens=12, extra_body=T0, messages=ASK,
                 stop_sequences=["\u2603", word])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word
    assert r.content[0].text == text[:text.index(word)]
    api = llm.create_chat_completion(ASK, max_tokens=12, temperature=0, stop=[word])
    assert api["choices"][0]["stop_reason"] == word  # vLLM's field, the stop string
    eos = sorted(llm.tokenizer.eos_ids)[0]
    r = _created(client, model="smollm2", max_tokens=12, messages=ASK,
                 extra_body={**T0, "logit_bias": {str(eos): 100}})
    assert r.stop_reason == "end_turn" and r.stop_sequence is None and r.content == []
    assert r.usage.output_tokens == 0


def test_stream_events_equal_the_whole_message(client, server):
    kw = dict(model="smollm2", max_tokens=10, extra_body=T0, messages=ASK, system=SYSTEM)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.usage.output_tokens == whole.usage.output_tokens == 10
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert final.stop_reason == "max_tokens"
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta" and kinds.count("content_block_start") == 1
    # the raw stream: each event named as its data's type, a ping after message_start
    _raw_events(server.url, {**{k: v for k, v in kw.items() if k != "extra_body"}, **T0})


def test_tool_use_round_trip_with_a_tool_result(client, llm):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model="smollm2", max_tokens=64, extra_body=T0, tools=[WEATHER])
    r = _created(client, messages=ask, tool_choice={"type": "tool", "name": "get_weather"},
                 **kw)
    assert r.stop_reason == "tool_use"
    call = r.content[-1]
    assert isinstance(call, at.ToolUseBlock) and call.id.startswith("toolu_")
    assert call.name == "get_weather" and isinstance(call.input["city"], str)
    with client.messages.stream(messages=ask, tool_choice={"type": "any"}, **kw) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert "input_json_delta" in kinds and streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == \
        [(call.name, call.input)]
    # the result comes back in a user turn: the model answers in text
    turns = ask + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                 "content": "18 C, sunny"}]}]
    answer = _created(client, messages=turns, **kw)
    assert answer.content and answer.content[0].type == "text"
    assert answer.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(messages=turns, **kw) as stream:
        assert "".join(stream.text_stream) == answer.content[0].text
    # the prompt is the one the same conversation in OpenAI's shape renders
    openai_turns = ask + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    plan = plan_chat_completion(llm, openai_turns, tools=OPENAI_WEATHER, enable_thinking=False)
    assert "18 C, sunny" in llm.tokenizer.decode(plan.ids)
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == len(plan.ids)
    counted = client.messages.count_tokens(model="smollm2", messages=turns, tools=[WEATHER])
    assert isinstance(counted, at.MessageTokensCount) and counted.input_tokens == len(plan.ids)


def test_count_tokens(client, llm):
    n = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=ASK)
    assert n.input_tokens == len(plan_chat_completion(llm, _openai(SYSTEM, ASK)).ids)
    with_tools = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=ASK,
                                              tools=[WEATHER])
    assert with_tools.input_tokens > n.input_tokens


def test_errors_are_the_clients_typed_exceptions(client, server):
    with pytest.raises(anthropic.NotFoundError, match="not served here") as e:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="max_tokens") as e:
        client.post("/v1/messages", body={"model": "smollm2", "messages": ASK},
                    cast_to=at.Message)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.AuthenticationError) as e:
        _client(server, "wrong").messages.create(model="smollm2", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported"):
        client.messages.create(model="smollm2", max_tokens=4, messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}])
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        client.messages.create(model="smollm2", max_tokens=4, messages=ASK,
                               extra_body={"temperature": -1})
    # the raw shapes: Anthropic's on its paths (bad JSON and the API key included), OpenAI's
    # elsewhere, with Authorization: Bearer still taken
    for path, body, headers, status in [
            ("/v1/messages", b"{", {"x-api-key": KEY}, 400),
            ("/v1/messages/count_tokens", {"model": "smollm2"}, {"x-api-key": KEY}, 400),
            ("/v1/messages", {"model": "smollm2"}, {"x-api-key": "wrong"}, 401),
            ("/v1/messages", {"model": "smollm2", "max_tokens": 4, "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x",
                                              "content": 5}]}]}, {"x-api-key": KEY}, 400),
            ("/v1/messages", {"model": "smollm2", "max_tokens": 4, "messages": [
                *ASK, {"role": "assistant", "content": "The"}]}, {"x-api-key": KEY}, 400)]:
        got, _, raw = request(server.url + path, body, headers)
        err = json.loads(raw)
        assert got == status and set(err) == {"type", "error"} and err["type"] == "error"
        assert set(err["error"]) == {"type", "message"} and err["error"]["message"]
    got, _, raw = request(server.url + "/v1/chat/completions", {"model": "nope", "messages": ASK},
                          {"Authorization": f"Bearer {KEY}"})
    assert got == 404 and set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}


def test_an_error_mid_stream_is_an_error_event():
    from edgellm.errors import ContextError
    from edgellm.server.errors import anthropic_body
    from edgellm.server.streaming import sse

    async def events():
        yield {"type": "message_start", "message": {}}
        raise ContextError("context is full")

    async def body():
        return [p async for p in sse(events(), set(), done=None, named=True,
                                     shape=anthropic_body).body_iterator]

    parts = asyncio.run(body())
    assert parts[0].startswith("event: message_start\n")
    head, data = parts[-1].strip().split("\n")
    assert head == "event: error"
    assert json.loads(data[6:]) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "context is full"}}


@pytest.fixture(scope="module")
def thinker(hermes_llm):
    s = ThreadServer(hermes_llm, model_id="thinker", max_tokens=512)
    yield s
    s.stop()


def test_thinking_blocks(thinker):
    client = _client(thinker, "none")
    tool = {"name": "get_time", "input_schema": TOOLS[1]["function"]["parameters"]}
    kw = dict(model="thinker", max_tokens=200, extra_body={"temperature": 1.0, "seed": 0},
              tools=[tool],
              tool_choice={"type": "any", "disable_parallel_tool_use": True},
              thinking={"type": "enabled", "budget_tokens": 4},
              messages=[{"role": "user", "content": "What time is it?"}])
    r = _created(client, **kw)
    assert [b.type for b in r.content] == ["thinking", "tool_use"]
    assert r.content[0].thinking and r.content[0].signature == ""
    assert r.stop_reason == "tool_use"
    with client.messages.stream(**kw) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in deltas and deltas[-1] == "input_json_delta"
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking.strip() == r.content[0].thinking
    assert final.content[1].input == r.content[1].input
    kinds = [e["content_block"]["type"] for e in _raw_events(thinker.url, {
        **{k: v for k, v in kw.items() if k != "extra_body"}, **kw["extra_body"]}, "none")
        if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "tool_use"]
    # without `thinking`, no thinking (Anthropic's default)
    off = client.messages.create(**{**kw, "thinking": {"type": "disabled"}})
    assert [b.type for b in off.content] == ["tool_use"]
