"""Anthropic's Messages API: requests translated for the engine (engine.py), answers and
streams in Anthropic's shape (its errors too: errors.shaped, by path).

    add_routes(app, served)   POST /v1/messages, /v1/messages/count_tokens

A request's system, messages (text, tool_use and tool_result blocks), tools (input_schema),
tool_choice and thinking become chat_completion's arguments in OpenAI's shape (assistant
tool_calls, tool messages); its chat completion comes back as a message of content blocks
(thinking: a reasoning model's, text, tool_use), and its stream as Anthropic's events
(message_start, content_block_start / _delta / _stop, message_delta, message_stop). A
thinking block's signature is empty: no one here checks it when it is sent back.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import Field

from .engine import sampling_fields
from .errors import APIError, anthropic_body
from .models import Served
from .schemas import _Body
from .streaming import sse


class Turn(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class PromptRequest(_Body):
    """What a prompt is made of: the body of /v1/messages/count_tokens."""

    model: str
    messages: list[Turn] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(PromptRequest):
    max_tokens: int = Field(ge=1)  # required, as Anthropic's API has it
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None  # accepted, unused
    stream: bool | None = False


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def add_routes(app: FastAPI, served: Served) -> None:
    settings = served.settings

    async def planned(req: PromptRequest, **kwargs):
        """The engine of req.model, and the plan of req's chat (kwargs: max_tokens, stop;
        a MessagesRequest's sampling fields too)."""
        engine = served.chat(req.model)
        if isinstance(req, MessagesRequest):
            kwargs.update(sampling_fields(req, engine.llm.tokenizer.eos_ids))
        if len(req.messages) > settings.max_messages:
            raise APIError(400, f"{len(req.messages)} messages: at most "
                           f"{settings.max_messages} are allowed", param="messages")
        messages, texts = _messages(req)
        tool_choice, parallel = _tool_choice(req.tool_choice)
        plan = await engine.plan_chat(
            messages, set(req.model_fields_set), texts, tools=_tools(req.tools),
            tool_choice=tool_choice, parallel_tool_calls=parallel, **_thinking(req.thinking),
            **kwargs)
        return engine, plan

    @app.post("/v1/messages")
    async def messages(req: MessagesRequest, request: Request):
        fields = set(req.model_fields_set)
        # Anthropic's clients send their model's ceiling (Claude Code's is tens of
        # thousands): a budget, cut to the server's --max-tokens rather than refused
        max_tokens = min(req.max_tokens, settings.max_tokens)
        engine, plan = await planned(req, max_tokens=max_tokens, stop=req.stop_sequences or ())
        head = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                "model": engine.model_id}
        if not req.stream:
            return _message(await engine.answer(request, plan, fields), head)
        chunks = await engine.stream(plan)
        return sse(_events(chunks, head, len(plan.ids)), fields, engine.error_of, done=None,
                   named=True, shape=anthropic_body)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(req: PromptRequest):
        _, plan = await planned(req)
        return {"input_tokens": len(plan.ids)}


# request -> chat_completion's arguments ------------------------------------------------
def _messages(req: PromptRequest) -> tuple[list[dict], list[str]]:
    """(the messages in OpenAI's shape, the texts of them every template renders). A user
    turn's tool_result blocks become tool messages before its text; an assistant turn's
    tool_use blocks its tool_calls; its thinking blocks are dropped (templates drop
    earlier reasoning)."""
    system = _text(req.system, "system") if req.system is not None else ""
    out = [{"role": "system", "content": system}] if system else []
    texts = [system]
    for i, turn in enumerate(req.messages):
        blocks = ([{"type": "text", "text": turn.content}] if isinstance(turn.content, str)
                  else turn.content)
        parts: list[str] = []
        calls, results = [], []
        for j, b in enumerate(blocks):
            where, kind = f"messages.{i}.content.{j}", b.get("type")
            if kind == "text":
                parts.append(_str(b, "text", where))
            elif kind == "tool_use" and turn.role == "assistant":
                calls.append({"id": _str(b, "id", where), "type": "function", "function": {
                    "name": _str(b, "name", where),
                    "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}})
            elif kind == "tool_result" and turn.role == "user":
                text = _text(b.get("content") or "", where + ".content")
                results.append({"role": "tool", "tool_call_id": _str(b, "tool_use_id", where),
                                "content": ("Error: " if b.get("is_error") else "") + text})
            elif kind in ("thinking", "redacted_thinking") and turn.role == "assistant":
                continue
            else:
                _refuse_block(kind, turn.role, where)
        if turn.role == "assistant":
            out.append({"role": "assistant", "content": "".join(parts) or (None if calls else ""),
                        **({"tool_calls": calls} if calls else {})})
            continue
        texts += parts + [r["content"] for r in results]
        out += results
        if parts or not results:
            out.append({"role": "user", "content": "".join(parts)})
    if req.messages[-1].role != "user":
        raise APIError(400, "messages: the last message must be the user's (continuing an "
                       "assistant's partial answer is not supported)", param="messages")
    return out, texts


def _text(content: str | list, where: str) -> str:
    """`content` (a string or text blocks) as one string, its blocks joined as OpenAI's
    text parts are (LLM.apply_chat_template); any other block refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: a string or a list of text blocks is required",
                       param=where)
    parts = []
    for j, b in enumerate(content):
        if not isinstance(b, dict) or b.get("type") != "text":
            _refuse_block(b.get("type") if isinstance(b, dict) else None, "", f"{where}.{j}")
        parts.append(_str(b, "text", f"{where}.{j}"))
    return "".join(parts)


def _refuse_block(kind: Any, role: str, where: str):
    if kind in ("image", "document"):
        raise APIError(400, f"{where}: {kind} blocks are not supported: this server's models "
                       "read text only", param=where)
    raise APIError(400, f"{where}: a {kind!r} block is not accepted here"
                   f"{' in a ' + role + ' turn' if role else ''}", param=where)


def _str(block: dict, key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{key}: a string is required", param=f"{where}.{key}")
    return value


def _tools(tools: list[dict] | None) -> list[dict] | None:
    """Anthropic's tools (name, description, input_schema) as OpenAI's functions."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom"):
            raise APIError(400, f"tools.{i}: {t['type']!r} is a server tool Anthropic runs; "
                           "this server runs none (give name, description, input_schema)",
                           param="tools")
        if not isinstance(t.get("input_schema"), dict):
            raise APIError(400, f"tools.{i}.input_schema: a JSON schema object is required",
                           param="tools")
        fn = {"name": _str(t, "name", f"tools.{i}"), "parameters": t["input_schema"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict | None) -> tuple[Any, bool]:
    """(OpenAI's tool_choice, parallel_tool_calls) for Anthropic's tool_choice."""
    if choice is None:
        return None, True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": _str(choice, "name", "tool_choice")}}, \
            parallel
    raise APIError(400, f"tool_choice.type: {kind!r} is not one of auto, any, tool, none",
                   param="tool_choice")


def _thinking(config: dict | None) -> dict:
    """chat_completion's thinking arguments: off unless asked (Anthropic's default),
    budget_tokens as the most tokens of reasoning."""
    kind = (config or {}).get("type", "disabled")
    if kind == "disabled":
        return {"enable_thinking": False}
    if kind == "enabled":
        return {"enable_thinking": True, "max_reasoning_tokens": config.get("budget_tokens")}
    if kind == "adaptive":
        return {"enable_thinking": True}
    raise APIError(400, f"thinking.type: {kind!r} is not one of enabled, disabled, adaptive",
                   param="thinking")


# a chat completion -> Anthropic's message ----------------------------------------------
def _message(completion: dict, head: dict) -> dict:
    choice = completion["choices"][0]
    msg = choice["message"]
    content = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"],
                        "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    content += [_tool_use(c) for c in msg.get("tool_calls") or []]
    return {**head, "content": content, **_stop(choice), "usage": _usage(completion["usage"])}


def _tool_use(call: dict) -> dict:
    fn = call["function"]
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
            "name": fn["name"], "input": json.loads(fn["arguments"])}


def _stop(choice: dict) -> dict:
    """stop_reason and stop_sequence (the stop string that ended it, if one did)."""
    if choice.get("stop_reason"):
        return {"stop_reason": "stop_sequence", "stop_sequence": choice["stop_reason"]}
    return {"stop_reason": STOP_REASONS[choice["finish_reason"]], "stop_sequence": None}


def _usage(usage: dict) -> dict:
    """Anthropic's usage: input_tokens are those not read from the prompt cache."""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": usage["prompt_tokens"] - cached,
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


# chat completion chunks -> Anthropic's events ------------------------------------------
class _Blocks:
    """The content blocks of a streamed message: one open at a time, each started,
    given deltas, and stopped."""

    def __init__(self):
        self.index, self.kind = -1, None

    def delta(self, kind: str, text: str) -> list[dict]:
        """Events adding `text` to a thinking or text block (opened when not open)."""
        events = [] if self.kind == kind else self.start(
            {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
            else {"type": "text", "text": ""})
        key = "thinking" if kind == "thinking" else "text"
        return events + [{"type": "content_block_delta", "index": self.index,
                          "delta": {"type": key + "_delta", key: text}}]

    def tool_use(self, call: dict) -> list[dict]:
        """The events of a whole tool_use block (its input as one input_json_delta)."""
        block = _tool_use(call)
        args = json.dumps(block.pop("input"), ensure_ascii=False)
        return self.start({**block, "input": {}}) + [
            {"type": "content_block_delta", "index": self.index,
             "delta": {"type": "input_json_delta", "partial_json": args}}] + self.stop()

    def start(self, block: dict) -> list[dict]:
        events = self.stop()
        self.index += 1
        self.kind = block["type"]
        return events + [{"type": "content_block_start", "index": self.index,
                          "content_block": block}]

    def stop(self) -> list[dict]:
        if self.kind is None:
            return []
        self.kind = None
        return [{"type": "content_block_stop", "index": self.index}]


async def _events(chunks, head: dict, prompt_tokens: int):
    """Anthropic's stream of a chat completion's chunks (the last with usage)."""
    yield {"type": "message_start", "message": {
        **head, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": _usage({"prompt_tokens": prompt_tokens, "completion_tokens": 0})}}
    yield {"type": "ping"}
    blocks, stop, usage = _Blocks(), None, None
    async for c in chunks:
        choice = c["choices"][0]
        delta = choice["delta"]
        events = []
        if delta.get("reasoning_content"):
            events += blocks.delta("thinking", delta["reasoning_content"])
        if delta.get("content"):
            events += blocks.delta("text", delta["content"])
        for call in delta.get("tool_calls") or []:
            events += blocks.tool_use(call)
        if choice["finish_reason"] is not None:
            stop, usage = _stop(choice), c.get("usage")
        for e in events:
            yield e
    for e in blocks.stop():
        yield e
    usage = _usage(usage) if usage else {"output_tokens": 0}
    yield {"type": "message_delta", "delta": stop or {"stop_reason": "max_tokens",
                                                      "stop_sequence": None},
           "usage": usage}
    yield {"type": "message_stop"}
