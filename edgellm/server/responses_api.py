"""OpenAI's Responses API: a request translated for the engine (engine.py) as a chat, the
answer back as a response object, or as the stream of its semantic events.

    add_routes(app, served)   POST /v1/responses, GET and DELETE /v1/responses/{id}

`instructions` (a system message) and `input` (a string, or items: messages, function_call
and function_call_output) become chat messages; `tools`, `tool_choice`, `text.format`,
`max_output_tokens` and `reasoning.effort` become chat_completion's arguments. The answer
comes back as output items in this order: a reasoning item (a thinking model's thoughts as
its summary text), a message (output_text), function_call items. A stream sends the
same items as events (response.created ... response.completed), each numbered by
sequence_number and named by its type. A response cut at max_output_tokens is
"incomplete" (incomplete_details.reason "max_output_tokens").

Responses are kept (`store`, true by default) in a bounded in-memory LRU together with
the conversation they end, so that `previous_response_id` continues it: its input and
output first, then the new input. As at OpenAI, the earlier `instructions` and `tools`
are not carried over.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from fastapi import FastAPI, Request
from pydantic import Field

from ..errors import EdgeLLMError
from ..sampling import SamplingParams
from .engine import max_tokens_of, message_texts, sampling_fields
from .errors import APIError
from .models import Served
from .schemas import _Body
from .streaming import sse

MAX_KEPT = 1000  # responses kept for previous_response_id
MAX_KEPT_BYTES = 64 << 20  # their JSON's bytes

_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")
# chat_completion's names of the request's fields (for edgellm's errors), and back
_CHAT_NAMES = {"input": "messages", "instructions": "messages", "text": "response_format",
               "max_output_tokens": "max_tokens"}
_API_NAMES = {"messages": "input", "prompt": "input", "response_format": "text",
              "max_tokens": "max_output_tokens"}


class ResponseRequest(_Body):
    """POST /v1/responses' body (the fields edgellm acts on; others are accepted)."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    stream: bool | None = False
    truncation: str | None = None  # "auto": the prompt's oldest tokens dropped to fit


class ResponseStore:
    """The newest responses (at most `max_items`, and `max_bytes` of JSON), each with the
    chat messages of the conversation it ends. A conversation's earlier messages are the
    dicts of the response they came from, shared, not copied: each response counts only
    its own JSON and its new input's."""

    def __init__(self, max_items: int = MAX_KEPT, max_bytes: int = MAX_KEPT_BYTES):
        self.max_items, self.max_bytes = max_items, max_bytes
        self.kept: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self.nbytes = 0

    def put(self, response: dict, messages: list[dict], new: list[dict]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(new))
        self.kept[response["id"]] = (response, messages, size)
        self.nbytes += size
        while self.kept and (len(self.kept) > self.max_items or self.nbytes > self.max_bytes):
            self.nbytes -= self.kept.popitem(last=False)[1][2]

    def get(self, rid: str, param: str | None = None) -> tuple[dict, list[dict]]:
        """(response, messages) of `rid`, a 404 in OpenAI's shape if it is not kept."""
        if rid not in self.kept:
            what = "Previous response" if param else "Response"
            raise APIError(404, f"{what} with id {rid!r} not found (responses are kept in "
                           f"memory: the newest {self.max_items}, while the server runs)",
                           "not_found_error", param, "not_found")
        self.kept.move_to_end(rid)
        response, messages, _ = self.kept[rid]
        return response, messages

    def pop(self, rid: str) -> dict:
        response, _ = self.get(rid)
        self.nbytes -= self.kept.pop(rid)[2]
        return response


def add_routes(app: FastAPI, served: Served) -> None:
    settings = served.settings
    store = ResponseStore()

    @app.post("/v1/responses")
    async def create_response(req: ResponseRequest, request: Request):
        engine = served.chat(req.model)
        for name, allowed in (("background", False), ("conversation", None)):
            if getattr(req, name, allowed) not in (allowed, None):
                raise APIError(400, f"{name} is not supported here (use previous_response_id "
                               "for a conversation)", param=name)
        history: list[dict] = []
        if req.previous_response_id is not None:
            _, history = store.get(req.previous_response_id, "previous_response_id")
        new = _input_messages(req.input, history)
        head = [{"role": "system", "content": req.instructions}] if req.instructions else []
        messages = head + history + new
        if len(messages) > settings.max_messages:
            raise APIError(400, f"{len(messages)} messages (the earlier responses' included): "
                           f"at most {settings.max_messages} are allowed", param="input")
        fields = {_CHAT_NAMES.get(f, f) for f in req.model_fields_set} | {"messages"}
        effort = (req.reasoning or {}).get("effort")
        sampling = sampling_fields(req, engine.llm.tokenizer.eos_ids)
        try:
            plan = await engine.plan_chat(
                messages, fields, message_texts(messages),
                -1 if req.truncation == "auto" else None, tools=_tools(req.tools),
                tool_choice=_tool_choice(req.tool_choice),
                response_format=_response_format(req.text),
                max_tokens=max_tokens_of(req.max_output_tokens, settings, "max_output_tokens"),
                parallel_tool_calls=req.parallel_tool_calls is not False,
                enable_thinking=None if effort is None else effort != "none", **sampling)
        except APIError as e:
            raise _renamed(e) from None
        shape = _Shape(req, engine.model_id, SamplingParams.from_generation_config(
            engine.llm.packed.generation_config, **sampling))

        def keep(response: dict, message: dict) -> None:
            if req.store is not False:
                reply = {"role": "assistant", "content": message["content"]}
                if message["tool_calls"]:
                    reply["tool_calls"] = message["tool_calls"]
                store.put(response, history + new + [reply], new)

        if not req.stream:
            completion = await engine.answer(request, plan, fields)
            choice = completion["choices"][0]
            message = {"content": choice["message"]["content"],
                       "tool_calls": choice["message"].get("tool_calls", []),
                       "reasoning_content": choice["message"].get("reasoning_content")}
            response = shape.response(_output(shape.rid, message, choice["finish_reason"]),
                                      choice["finish_reason"], completion["usage"])
            keep(response, message)
            return response

        def error_of(e: EdgeLLMError, fields: set[str]) -> APIError:
            return _renamed(engine.error_of(e, fields))

        chunks = await engine.stream(plan)
        return sse(_events(chunks, shape, keep, fields, error_of), fields, error_of,
                   done=None, named=True)

    @app.get("/v1/responses/{rid}")
    async def get_response(rid: str):
        return store.get(rid)[0]

    @app.delete("/v1/responses/{rid}")
    async def delete_response(rid: str):
        store.pop(rid)
        return {"id": rid, "object": "response", "deleted": True}


# request -> chat arguments -------------------------------------------------------------
def _input_messages(input: str | list[dict], history: list[dict]) -> list[dict]:
    """The request's input items as chat messages: function_call items as the tool_calls
    of an assistant message (the one they follow, if any), function_call_output items as
    tool messages (named after their call, here or in `history`, for templates that show
    the name)."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    if not input:
        raise APIError(400, "input is empty", param="input")
    names = {c["id"]: c["function"]["name"] for m in history for c in m.get("tool_calls", ())}
    out: list[dict] = []
    for i, item in enumerate(input):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = _ROLES.get(item.get("role"))
            if role is None:
                raise APIError(400, f"{where}.role must be one of {', '.join(_ROLES)}, got "
                               f"{item.get('role')!r}", param="input")
            out.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            names[call["id"]] = call["function"]["name"]
            if out and out[-1]["role"] == "assistant":
                out[-1]["tool_calls"] = out[-1].get("tool_calls", []) + [call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if call_id not in names:  # as OpenAI refuses it: an answer to no question
                raise APIError(400, f"{where}: no function_call with call_id {call_id!r} "
                               "comes before this output", param="input")
            out.append({"role": "tool", "tool_call_id": call_id, "name": names[call_id],
                        "content": _content(item.get("output"), where + ".output")})
        elif kind != "reasoning":  # earlier thoughts: templates leave them out of a prompt
            raise APIError(400, f"{where}: items of type {kind!r} are not supported (message,"
                           " function_call, function_call_output)", param="input")
    return out


def _content(content: Any, where: str) -> str | list[dict]:
    """A message's content: a string, or its text parts (as the chat templates take them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of parts",
                       param="input")
    parts = []
    for j, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") not in _TEXT_PARTS \
                or not isinstance(p.get("text"), str):
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise APIError(400, f"{where}.content[{j}]: parts of type {kind!r} are not "
                           "supported (input_text and output_text parts with their text)",
                           param="input")
        parts.append({"type": "text", "text": p["text"]})
    return parts


def _string(item: dict, key: str, where: str) -> str:
    if not isinstance(item.get(key), str):
        raise APIError(400, f"{where}.{key} must be a string", param="input")
    return item[key]


def _tools(tools: list[dict] | None) -> list[dict] | None:
    """Function tools ({type, name, description, parameters, strict}) in the chat's shape."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function":
            raise APIError(400, f"tools[{i}]: tools of type {t.get('type')!r} are not "
                           "supported (function tools only)", param="tools")
        out.append({"type": "function", "function": {
            k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}})
    return out


def _tool_choice(choice: str | dict | None) -> str | dict | None:
    if choice is None or isinstance(choice, str):  # "auto", "none", "required" (checked)
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, "tool_choice must be 'auto', 'none', 'required' or {'type': "
                   "'function', 'name': ...}", param="tool_choice")


def _response_format(text: dict | None) -> dict | None:
    """text.format as the chat's response_format."""
    fmt = (text or {}).get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}}
    raise APIError(400, "text.format must be {'type': 'text'}, {'type': 'json_object'} or "
                   "{'type': 'json_schema', 'name': ..., 'schema': ...}", param="text")


def _renamed(e: APIError) -> APIError:
    """An error about a chat argument, named after the Responses field it came from."""
    e.param = _API_NAMES.get(e.param, e.param)
    return e


# answer -> response --------------------------------------------------------------------
class _Shape:
    """The response object of one request, but for its output, status and usage (the
    request's settings echoed as the SDK's Response type has them)."""

    def __init__(self, req: ResponseRequest, model: str, params: SamplingParams):
        self.rid = "resp_" + uuid.uuid4().hex
        fmt = (req.text or {}).get("format") or {"type": "text"}
        self.fields = {
            "id": self.rid, "object": "response", "created_at": int(time.time()),
            "background": False, "error": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": None,
            "model": model, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": None if req.reasoning is None else {
                k: req.reasoning.get(k) for k in ("effort", "summary")},
            "temperature": params.temperature, "top_p": params.top_p,
            "text": {**(req.text or {}), "format": fmt},
            "tool_choice": req.tool_choice or ("auto" if req.tools else "none"),
            "tools": [{"type": "function", "name": t.get("name"),
                       "description": t.get("description"), "parameters": t.get("parameters"),
                       "strict": t.get("strict")} for t in req.tools or ()],
            "truncation": req.truncation or "disabled", "user": req.user,
            "metadata": req.metadata or {}}

    def response(self, output: list[dict], finish: str | None,
                 usage: dict | None = None) -> dict:
        """The response with `output`: in progress (finish None), else completed, or
        incomplete if cut at max_output_tokens (finish "length")."""
        status = ("in_progress" if finish is None else
                  "incomplete" if finish == "length" else "completed")
        return {**self.fields, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None,
                "incomplete_details": ({"reason": "max_output_tokens"}
                                       if status == "incomplete" else None),
                "output": output, "usage": _usage(usage) if usage is not None else None}


def _usage(usage: dict) -> dict:
    """The chat's usage in the Responses API's names."""
    cache = usage.get("prompt_tokens_details") or {}
    thought = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cache.get("cached_tokens", 0),
                                     "cache_write_tokens": cache.get("cache_write_tokens", 0)},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": thought},
            "total_tokens": usage["total_tokens"]}


def _output(rid: str, message: dict, finish: str) -> list[dict]:
    """The output items of an answer (`message`: content, tool_calls, reasoning_content):
    its thoughts, its text (also when empty, unless it made calls), its calls. Item ids
    follow from the response's, so that a stream's events and its last object agree."""
    status = "incomplete" if finish == "length" else "completed"
    out = []
    if message["reasoning_content"]:
        out.append(_reasoning_item(rid, message["reasoning_content"]))
    if message["content"] or not message["tool_calls"]:
        out.append(_message_item(rid, message["content"] or "", status))
    out += [_call_item(rid, i, c) for i, c in enumerate(message["tool_calls"])]
    return out


def _reasoning_item(rid: str, text: str) -> dict:
    return {"id": "rs_" + rid[5:], "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}]}


def _message_item(rid: str, text: str, status: str) -> dict:
    return {"id": "msg_" + rid[5:], "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(rid: str, i: int, call: dict, status: str = "completed") -> dict:
    return {"id": f"fc_{rid[5:]}_{i}", "type": "function_call", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "status": status}


# the stream ----------------------------------------------------------------------------
class _Numbered:
    """The events of one response, numbered; each output item's events from added to done
    as the Responses API sends them (a message's through its one output_text part, a
    reasoning item's through its one summary part)."""

    def __init__(self):
        self.seq, self.index = 0, -1

    def event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def added(self, item: dict) -> list[dict]:
        self.index += 1
        at = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "message":
            return [self.event("response.output_item.added", output_index=self.index,
                               item={**item, "status": "in_progress", "content": []}),
                    self.event("response.content_part.added", **at, content_index=0,
                               part={**item["content"][0], "text": ""})]
        if item["type"] == "reasoning":
            return [self.event("response.output_item.added", output_index=self.index,
                               item={**item, "summary": []}),
                    self.event("response.reasoning_summary_part.added", **at,
                               summary_index=0, part={"type": "summary_text", "text": ""})]
        return [self.event("response.output_item.added", output_index=self.index,
                           item={**item, "status": "in_progress", "arguments": ""})]

    def delta(self, item: dict, text: str) -> dict:
        at = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "message":
            return self.event("response.output_text.delta", **at, content_index=0,
                              delta=text, logprobs=[])
        if item["type"] == "reasoning":
            return self.event("response.reasoning_summary_text.delta", **at, summary_index=0,
                              delta=text)
        return self.event("response.function_call_arguments.delta", **at, delta=text)

    def done(self, item: dict) -> list[dict]:
        at = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "message":
            part = item["content"][0]
            out = [self.event("response.output_text.done", **at, content_index=0,
                              text=part["text"], logprobs=[]),
                   self.event("response.content_part.done", **at, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            part = item["summary"][0]
            out = [self.event("response.reasoning_summary_text.done", **at, summary_index=0,
                              text=part["text"]),
                   self.event("response.reasoning_summary_part.done", **at, summary_index=0,
                              part=part)]
        else:
            out = [self.event("response.function_call_arguments.done", **at,
                              name=item["name"], arguments=item["arguments"])]
        return out + [self.event("response.output_item.done", output_index=self.index,
                                 item=item)]

    def whole(self, item: dict, text: str) -> list[dict]:
        return self.added(item) + ([self.delta(item, text)] if text else []) + self.done(item)


async def _events(chunks, shape: _Shape, keep, fields: set[str], error_of):
    """The chat's chunks as the Responses API's events: the reasoning and the text as they
    come, the calls (held by the chat until its end) after the text, the response last
    (kept before it is sent, so that a client can continue from it at once)."""
    rid, numbered = shape.rid, _Numbered()
    start = shape.response([], None)
    yield numbered.event("response.created", response=start)
    yield numbered.event("response.in_progress", response=start)
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    calls: list[dict] = []
    finish, usage, pending = "length", None, ""
    opened: dict[str, dict] = {}  # the items whose added events went out, by kind
    closed: set[str] = set()
    try:
        async for c in chunks:
            choice = c["choices"][0]
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                parts["reasoning"].append(delta["reasoning_content"])
                # the whole answer's reasoning is stripped: the deltas add up to it
                pending += delta["reasoning_content"]
                if pending.strip():
                    if "reasoning" not in opened:
                        opened["reasoning"] = _reasoning_item(rid, "")
                        for e in numbered.added(opened["reasoning"]):
                            yield e
                        pending = pending.lstrip()
                    yield numbered.delta(opened["reasoning"], pending)
                    pending = ""
            if delta.get("content"):
                parts["content"].append(delta["content"])
                if "reasoning" in opened and "reasoning" not in closed:
                    closed.add("reasoning")
                    for e in numbered.done(_reasoning_item(rid, "".join(
                            parts["reasoning"]).strip())):
                        yield e
                if "message" not in opened:
                    opened["message"] = _message_item(rid, "", "in_progress")
                    for e in numbered.added(opened["message"]):
                        yield e
                yield numbered.delta(opened["message"], delta["content"])
            calls += [{k: v for k, v in tc.items() if k != "index"}
                      for tc in delta.get("tool_calls") or ()]
            if choice["finish_reason"] is not None:
                finish, usage = choice["finish_reason"], c.get("usage")
    except EdgeLLMError as e:
        err = error_of(e, fields)
        yield numbered.event("error", code=err.code or err.type, message=err.message,
                             param=err.param)
        return
    message = {"content": "".join(parts["content"]) or (None if calls else ""),
               "tool_calls": calls, "reasoning_content": "".join(parts["reasoning"]).strip()}
    output = _output(rid, message, finish)
    for item in output:
        kind = item["type"]
        if kind in closed:
            continue
        if kind in opened:
            for e in numbered.done(item):
                yield e
        else:
            text = (item["content"][0]["text"] if kind == "message" else
                    item["summary"][0]["text"] if kind == "reasoning" else item["arguments"])
            for e in numbered.whole(item, text):
                yield e
    response = shape.response(output, finish, usage)
    keep(response, message)
    yield numbered.event("response.incomplete" if response["status"] == "incomplete"
                         else "response.completed", response=response)
