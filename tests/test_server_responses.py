"""OpenAI's Responses API (/v1/responses) driven by the official openai client: SmolLM2-135M
on a loopback port (in-process), the answers' JSON checked against the SDK's own types."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from openai.types.responses import (  # noqa: E402
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseUsage,
)
from openai.types.responses.response_usage import (  # noqa: E402
    InputTokensDetails,
    OutputTokensDetails,
)
from server_helpers import ThreadServer, request  # noqa: E402
from test_server import llm  # noqa: E402, F401 -- SmolLM2-135M, as the chat routes' tests
from test_tool_calls import hermes_llm  # noqa: E402, F401 -- a tiny model that thinks

ASK = "What is the capital of France?"
WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
ITEM_TYPES = {"message": ResponseOutputMessage, "function_call": ResponseFunctionToolCall,
              "reasoning": ResponseReasoningItem}


@pytest.fixture(scope="module")
def server(llm):  # noqa: F811
    s = ThreadServer(llm, parallel=2, max_tokens=512)
    yield s
    s.stop()


def _post(server, body: dict) -> tuple[int, dict]:
    status, _, raw = request(server.url + "/v1/responses", body)
    return status, json.loads(raw)


def _keys_match(raw: dict, model) -> None:
    """Every field the SDK's `model` requires is in `raw`, and no key it does not know."""
    fields = model.model_fields
    assert set(raw) <= set(fields), set(raw) - set(fields)
    assert {k for k, f in fields.items() if f.is_required()} <= set(raw)


def check_shape(raw: dict) -> Response:
    """`raw` (a response's JSON) has the SDK's fields, no more, in its items and usage too,
    and validates as its Response type."""
    _keys_match(raw, Response)
    for item in raw["output"]:
        _keys_match(item, ITEM_TYPES[item["type"]])
        for part in item.get("content") or ():
            _keys_match(part, ResponseOutputText)
    if raw["usage"] is not None:
        _keys_match(raw["usage"], ResponseUsage)
        _keys_match(raw["usage"]["input_tokens_details"], InputTokensDetails)
        _keys_match(raw["usage"]["output_tokens_details"], OutputTokensDetails)
    return Response.model_validate(raw)


def test_string_and_item_inputs_answer_as_the_chat(server, llm):  # noqa: F811
    c = server.client()
    r = c.responses.create(model="smollm2", input=ASK, max_output_tokens=12, temperature=0)
    chat = llm.create_chat_completion([{"role": "user", "content": ASK}], max_tokens=12,
                                      temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "smollm2"
    assert r.output_text == chat["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.output[0].content[0].annotations == []
    items = [{"role": "developer", "content": "Answer in one word."},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "What is the capital"},
                          {"type": "input_text", "text": " of France?"}]}]
    r = c.responses.create(model="smollm2", input=items, max_output_tokens=8, temperature=0,
                           instructions="You are terse.", metadata={"k": "v"}, user="u1")
    chat = llm.create_chat_completion(
        [{"role": "system", "content": "You are terse."},
         {"role": "system", "content": "Answer in one word."},
         {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                      {"type": "text", "text": " of France?"}]}],
        max_tokens=8, temperature=0)
    assert r.output_text == chat["choices"][0]["message"]["content"]
    assert r.instructions == "You are terse." and r.metadata == {"k": "v"} and r.user == "u1"
    status, raw = _post(server, {"model": "smollm2", "input": ASK, "max_output_tokens": 4,
                                 "temperature": 0})
    assert status == 200
    check_shape(raw)
    assert "output_text" not in raw  # the SDK's convenience, not the API's


def test_stream_events_in_order_and_equal_to_the_whole_answer(server):
    c = server.client()
    kw = dict(model="smollm2", input="Tell me a story about a dragon.", max_output_tokens=16,
              temperature=0)
    whole = c.responses.create(**kw)
    events = list(c.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:6] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta", "response.output_text.delta"]
    n = kinds.count("response.output_text.delta")
    assert kinds[4 + n:] == ["response.output_text.done", "response.content_part.done",
                             "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-4].text
    last = events[-1].response
    assert last.status == "incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert last.output_text == text  # the same usage, but for the tokens the cache gave
    assert last.usage.model_copy(update={"input_tokens_details": None}) == \
        whole.usage.model_copy(update={"input_tokens_details": None})
    assert last.output[0].id == events[2].item.id
    # the raw events are named by their type
    status, headers, raw = request(server.url + "/v1/responses", {**kw, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    blocks = raw.decode().strip().split("\n\n")
    for block in blocks:
        name, data = block.split("\n")
        assert name == "event: " + json.loads(data.removeprefix("data: "))["type"]
    check_shape(json.loads(blocks[-1].split("\n")[1][6:])["response"])


def test_completed_when_the_answer_ends(server):
    c = server.client()
    r = c.responses.create(model="smollm2", input=ASK, max_output_tokens=200, temperature=0)
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output[0].status == "completed" and r.usage.output_tokens < 200
    events = list(c.responses.create(model="smollm2", input=ASK, max_output_tokens=200,
                                      temperature=0, stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == r.output_text
    # the SDK's stream helper accumulates the same response (it knows only completed ones)
    with c.responses.stream(model="smollm2", input=ASK, max_output_tokens=200,
                            temperature=0) as stream:
        assert stream.get_final_response().output_text == r.output_text


def test_max_output_tokens_makes_it_incomplete(server):
    r = server.client().responses.create(model="smollm2", input=ASK, max_output_tokens=3,
                                         temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_function_call_round_trip_with_previous_response_id(server, llm):  # noqa: F811
    c = server.client()
    ask = "What is the weather in Paris?"
    first = c.responses.create(model="smollm2", input=ask, tools=WEATHER,
                               tool_choice="required", max_output_tokens=64, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].status == "completed"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    assert calls[0].call_id and calls[0].id.startswith("fc_")
    assert first.tools[0].name == "get_weather" and first.tool_choice == "required"
    second = c.responses.create(
        model="smollm2", previous_response_id=first.id, tools=WEATHER, tool_choice="none",
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18 C and sunny"}], max_output_tokens=24, temperature=0)
    assert second.previous_response_id == first.id
    # the same as the chat the conversation spells out
    history = [{"role": "user", "content": ask},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": calls[0].call_id, "type": "function",
                   "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
               {"role": "tool", "tool_call_id": calls[0].call_id, "name": "get_weather",
                "content": "18 C and sunny"}]
    chat = llm.create_chat_completion(
        history, tools=[{"type": "function", "function": {
            k: v for k, v in WEATHER[0].items() if k != "type"}}], tool_choice="none",
        max_tokens=24, temperature=0)
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert second.output_text == chat["choices"][0]["message"]["content"]
    # the same conversation as items, with no stored response
    again = c.responses.create(
        model="smollm2", tools=WEATHER, tool_choice="none", store=False,
        input=[{"role": "user", "content": ask}, *[o.model_dump() for o in first.output],
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18 C and sunny"}], max_output_tokens=24, temperature=0)
    assert again.output_text == second.output_text
    with pytest.raises(openai.NotFoundError):  # store=False: not kept
        c.responses.retrieve(again.id)
    # a named function, streamed: its arguments as events
    events = list(c.responses.create(model="smollm2", input=ask, tools=WEATHER,
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     max_output_tokens=64, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.name == "get_weather" and json.loads(done.arguments)["city"]
    assert events[-1].response.output[-1].arguments == done.arguments


def test_text_format_json_schema_validates(server):
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    r = server.client().responses.create(model="smollm2", input="Invent a person.",
                                         text={"format": fmt}, max_output_tokens=64,
                                         temperature=0)
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    r = server.client().responses.create(model="smollm2", input="Invent a person as JSON.",
                                         text={"format": {"type": "json_object"}},
                                         max_output_tokens=48, temperature=0)
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)


def test_kept_responses_are_retrieved_and_deleted(server):
    c = server.client()
    r = c.responses.create(model="smollm2", input=ASK, max_output_tokens=2, temperature=0)
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)


def test_unknown_previous_response_is_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client().responses.create(model="smollm2", input="Hi",
                                         previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    assert "resp_nope" in e.value.body["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"tools": WEATHER, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "text"),
    ({"input": [{"type": "message", "role": "user",
                 "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"type": "computer_call_output"}]}, "input"),
    ({"input": []}, "input"),
    ({"input": "word " * 100000}, "input"),  # past the context, refused before rendering
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
     "input"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"background": True}, "background"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    status, err = _post(server, {"model": "smollm2", "input": "Hi", **body})
    assert status == 400 and err["error"]["param"] == param, err
    assert err["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError):
        server.client().responses.create(model="nope", input="Hi")


def test_an_error_mid_stream_is_an_error_event():
    """A generation that fails after the stream began: an `error` event, numbered, last."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from edgellm.errors import ContextError
    from edgellm.server import responses_api
    from edgellm.server.engine import Settings

    class Engine:  # plans, then fails while streaming
        model_id = "m"

        class llm:  # noqa: N801
            class tokenizer:  # noqa: N801
                eos_ids = [0]

            class packed:  # noqa: N801
                generation_config = {}

        async def plan_chat(self, *args, **kwargs):
            return None

        async def stream(self, plan):
            async def chunks():
                yield {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]}
                raise ContextError("the context is full")
            return chunks()

        def error_of(self, e, fields):
            from edgellm.server.errors import from_edgellm

            return from_edgellm(e, fields)

    class Served:
        settings = Settings(model_id="m")

        def chat(self, name):
            return Engine()

    app = FastAPI()
    responses_api.add_routes(app, Served())
    with TestClient(app) as client:
        raw = client.post("/v1/responses", json={"model": "m", "input": "x", "stream": True})
    blocks = [b.split("\n") for b in raw.text.strip().split("\n\n")]
    events = [json.loads(data[6:]) for _, data in blocks]
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "error"]
    assert events[-1]["sequence_number"] == 5 and events[-1]["param"] == "input"
    assert events[-1]["code"] == "context_length_exceeded"
    assert blocks[-1][0] == "event: error"


def test_a_thinking_model_answers_with_a_reasoning_item(hermes_llm):  # noqa: F811
    """A thinking template (a tiny random model, which thinks until max_output_tokens under
    a schema): its thoughts as a reasoning item's summary, counted as reasoning tokens,
    streamed as reasoning_summary_text deltas that add up to it."""
    s = ThreadServer(hermes_llm, max_tokens=64)
    try:
        c = s.client()
        fmt = {"type": "json_schema", "name": "n", "schema": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}
        kw = dict(model="smollm2", input="Weather in Oslo?", text={"format": fmt},
                  max_output_tokens=12, temperature=0)
        r = check_shape(c.responses.with_raw_response.create(**kw).http_response.json())
        assert [o.type for o in r.output] == ["reasoning", "message"]
        thought = r.output[0].summary[0].text
        assert thought and thought == thought.strip() and r.status == "incomplete"
        assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
        events = list(c.responses.create(**kw, stream=True))
        kinds = [e.type for e in events]
        assert kinds[2:4] == ["response.output_item.added",
                              "response.reasoning_summary_part.added"]
        deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
        assert "".join(deltas) == thought
        done = kinds.index("response.reasoning_summary_text.done")
        assert kinds[done:done + 3] == ["response.reasoning_summary_text.done",
                                        "response.reasoning_summary_part.done",
                                        "response.output_item.done"]
        assert events[-1].response.output[0].summary[0].text == thought
        assert [e.sequence_number for e in events] == list(range(len(events)))
        raw = c.responses.with_raw_response.create(**kw, reasoning={"effort": "none"})
        off = check_shape(raw.http_response.json())
        assert [o.type for o in off.output] == ["message"]
        assert off.usage.output_tokens_details.reasoning_tokens == 0
        assert off.reasoning.effort == "none"
    finally:
        s.stop()


def test_the_store_keeps_the_newest_within_its_bounds():
    from edgellm.server.errors import APIError
    from edgellm.server.responses_api import ResponseStore

    store = ResponseStore(max_items=2, max_bytes=400)
    for rid in ("a", "b", "c"):
        store.put({"id": rid}, [], [])
    assert list(store.kept) == ["b", "c"]
    store.get("b")  # used: now the newest
    store.put({"id": "d"}, [], [])
    assert list(store.kept) == ["b", "d"]
    store.put({"id": "e", "text": "x" * 390}, [], [])  # alone past the byte bound
    assert list(store.kept) == [] and store.nbytes == 0
    with pytest.raises(APIError) as e:
        store.get("e", "previous_response_id")
    assert e.value.status == 404 and e.value.param == "previous_response_id"
