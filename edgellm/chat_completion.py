"""`LLM.create_chat_completion`: OpenAI's chat.completion objects, as llama-cpp-python returns.

    llm.create_chat_completion(messages, tools=None, tool_choice=None, response_format=None,
                               stream=False, max_tokens=None, stop=(), enable_thinking=None,
                               chat_template_kwargs=None, max_reasoning_tokens=None,
                               parallel_tool_calls=True, parse_special=False, **sampling)

returns {"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0,
"message": {"role": "assistant", "content", "tool_calls"?, "reasoning_content"?},
"finish_reason": "stop" | "length" | "tool_calls", "stop_reason"?}], "usage": {...}}
("stop_reason", vLLM's: the stop string that ended the answer, only when one did); with
stream=True, an iterator of "chat.completion.chunk" dicts whose deltas carry
"reasoning_content" and "content" as they come (with tools, the content is held until the
end, where it is either parsed into "tool_calls" or sent as content). Tool calls end where
one repeats an earlier call (it is dropped) and a named tool_choice makes one call; an
answer cut at max_tokens keeps the complete calls it made, with finish_reason "length".

Everything is checked, the prompt rendered and the constraint compiled before the first
token (errors raise at the call, also with stream=True). A generation may run in phases on
one KV cache: thinking free, then the answer under the constraint (response_format or a
tool call); max_reasoning_tokens closes the thinking block by writing "</think>" for the
model. Special-token text inside the messages (and tools) is tokenized as text, so that
no message can forge a turn; parse_special=True reads it as the tokens (LLM.encode_chat).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import arguments
from .errors import ArgumentError, ConstraintError
from .lifetime import wait_arguments
from .text import reasoning, tool_calls


@dataclass
class _Plan:
    ids: list[int]
    constraint: Any  # Constraint | None
    fmt: str
    tool_mode: str  # "none", "auto", "required"
    thinking: bool  # the template knows <think> blocks
    inside: bool  # the prompt ends inside an open <think>
    max_tokens: int
    max_reasoning_tokens: int | None
    stop: list[str]
    sampling: dict = field(default_factory=dict)


def _plan(llm, messages, tools, tool_choice, response_format, max_tokens, stop,
          enable_thinking, chat_template_kwargs, max_reasoning_tokens, sampling,
          parallel_tool_calls: bool = True) -> _Plan:
    from .text.constraints import ConstraintSpec, spec_from

    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) \
            or not all(isinstance(m, Mapping) for m in messages):
        raise ArgumentError("messages must be a list of {'role': ..., 'content': ...}")
    # the plain arguments first, so that a wrong type is named before any work
    max_tokens = arguments.integer(max_tokens, "max_tokens", 0, none=True)
    max_reasoning_tokens = arguments.integer(max_reasoning_tokens, "max_reasoning_tokens", 0,
                                             none=True)
    parallel_tool_calls = arguments.flag(parallel_tool_calls, "parallel_tool_calls")
    if enable_thinking is not None:
        enable_thinking = arguments.flag(enable_thinking, "enable_thinking")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise ArgumentError("chat_template_kwargs must be a dict or None, got "
                            f"{type(chat_template_kwargs).__name__}")
    stop = arguments.stops(stop)
    parse_special = arguments.flag(sampling.pop("parse_special", False), "parse_special")
    # the sampling arguments as stream_ids will take them: refused here, at the call (a
    # stream's first chunk would otherwise come before its error)
    wait = {k: sampling[k] for k in ("blocking", "timeout") if k in sampling}
    llm.sampler(**{k: v for k, v in sampling.items() if k not in wait and k != "speculative"})
    arguments.flag(sampling.get("speculative", True), "speculative")
    wait_arguments(wait.get("blocking", True), wait.get("timeout"))
    template = llm.packed.chat_template
    fmt = tool_calls.detect_format(template)
    tools = tool_calls.check_tools(tools) if tools is not None else []
    mode, callable_tools = tool_calls.chosen(tools, tool_choice)
    kwargs = dict(chat_template_kwargs or {})
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    use_tools = callable_tools if mode != "none" else []
    msgs = tool_calls.prepare_messages(messages, use_tools, fmt)
    if use_tools and fmt != "generic":
        kwargs["tools"] = use_tools
    # the template's special tokens are tokens; the messages' are text unless parse_special
    text, literal = llm._chat_text(msgs, True, parse_special, **kwargs)
    ids = llm._encode(text, literal=literal)
    spec = spec_from(response_format=response_format)
    if use_tools:
        if spec is not None and mode == "required":
            raise ConstraintError("response_format and tool_choice 'required' cannot both "
                                  "constrain the answer")
        # a named function is called once: its one call (a sampled model repeats it)
        named = isinstance(tool_choice, Mapping)
        grammar = tool_calls.grammar(callable_tools, fmt, mode, llm.constraint_engine.token_id,
                                     parallel=bool(parallel_tool_calls) and not named)
        if grammar is not None and spec is None:
            from .text.constraints import lark_grammar

            spec = ConstraintSpec("tools", lark_grammar(grammar))
    if max_tokens is None:
        max_tokens = int(llm.packed.generation_config.get("max_new_tokens") or 256)
    thinking = reasoning.supports_thinking(template) and enable_thinking is not False
    return _Plan(ids=ids, constraint=llm.constraint(spec) if spec is not None else None,
                 fmt=fmt, tool_mode=mode if use_tools else "none", thinking=thinking,
                 inside=thinking and reasoning.opens_thinking(text), max_tokens=max_tokens,
                 max_reasoning_tokens=max_reasoning_tokens,
                 stop=stop, sampling=sampling)


def _events(llm, plan: _Plan,
            cancelled: Callable[[], bool] | None = None) -> Iterator[tuple[str, Any]]:
    """("reasoning" | "content", text) pieces, then ("finish", reason), ("stop", the stop
    string that ended it, or None) and ("usage", (tokens generated, those of them
    thinking, prompt ids taken from a cache)). Once `cancelled()` (checked after each
    token) the generation ends there."""
    splitter = reasoning.ReasoningSplitter(inside=plan.inside)
    ids = list(plan.ids)
    # With a constraint, a thinking model thinks freely first: open the block for it (a
    # lazy tool grammar, tool_choice "auto", leaves the model free anyway).
    free_first = plan.thinking and plan.constraint is not None and plan.tool_mode != "auto"
    if free_first and not plan.inside:
        ids += llm.tokenizer.encode(reasoning.OPEN + "\n")
        splitter.inside = True
    constraint = None if free_first else plan.constraint
    generated = reasoning_tokens = phase = cached = 0
    finish, stopped_by = "length", None
    keep = False
    repeats = tool_calls.Repeats(plan.fmt) if plan.tool_mode != "none" else None
    while True:
        sampling = dict(plan.sampling)
        if phase and sampling.get("seed") is not None:
            sampling["seed"] = sampling["seed"] + phase  # a fresh draw sequence per phase
        budget = plan.max_tokens - generated
        if budget <= 0:
            break
        chunks = llm.stream_ids(ids, max_tokens=budget, stop=plan.stop, keep_cache=keep,
                                constraint=constraint, **sampling)
        switch = None
        for chunk in chunks:
            if chunk.token is not None:
                generated += 1
                if splitter.inside and plan.thinking:
                    reasoning_tokens += 1
            was_inside = splitter.inside
            repeated = False
            for piece in (splitter.feed(chunk.text) if plan.thinking else
                          [("content", chunk.text)] if chunk.text else []):
                yield piece
                repeated |= piece[0] == "content" and repeats is not None \
                    and repeats.feed(piece[1])
            if repeated:  # a call equal to an earlier one: the list of calls ends
                finish = "stop"
                break
            if chunk.finish_reason is not None:
                finish, stopped_by = chunk.finish_reason, chunk.stop
                if finish == "stop" and splitter.inside and free_first and constraint is None \
                        and not plan.stop:
                    switch, last = "close", None  # EOS while thinking: the answer is due
                break
            if cancelled is not None and cancelled():
                break  # no one waits for the rest
            if splitter.inside and plan.max_reasoning_tokens is not None \
                    and reasoning_tokens >= plan.max_reasoning_tokens:
                switch = "close"
            elif was_inside and not splitter.inside and free_first and constraint is None:
                switch = "answer"
            if switch:
                last = chunk.token
                break
        chunks.close()
        if not phase:  # the prompt's ids a cache gave (its first stream has set it up)
            cached = min(getattr(llm.prompt_cache, "reused", 0), len(plan.ids))
        if switch is None:
            break
        # the last sampled token is not in the cache yet: run it, then what we write
        tail = "\n" + reasoning.CLOSE + "\n\n" if switch == "close" else "\n\n"
        ids = ([last] if last is not None else []) + llm.tokenizer.encode(tail)
        splitter.inside = False
        constraint = plan.constraint
        keep = True
        phase += 1
    for piece in splitter.flush():
        yield piece
    yield "finish", finish
    yield "stop", stopped_by
    yield "usage", (generated, reasoning_tokens, cached)


def _base(llm, kind: str) -> dict:
    return {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "object": kind,
            "created": int(time.time()), "model": llm.packed.path.name}


def _finish_tools(plan: _Plan, content: str) -> tuple[str | None, list[dict]]:
    if plan.tool_mode == "none":
        return content, []
    text, calls = tool_calls.parse(content, plan.fmt)
    return (text or None) if calls else content, [c.to_openai() for c in calls]


def _usage(plan: _Plan, counts: tuple[int, int, int]) -> dict:
    completion, thought, cached = counts
    usage = {"prompt_tokens": len(plan.ids), "completion_tokens": completion,
             "total_tokens": len(plan.ids) + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}  # OpenAI's: not prefilled
    if plan.thinking:  # OpenAI's count of the thinking tokens among the completion's
        usage["completion_tokens_details"] = {"reasoning_tokens": thought}
    return usage


class _Ending:
    """How a generation ended, from _events' last items: its finish reason, the stop string
    that ended it (or None) and its counts (tokens generated, those of them thinking, prompt
    tokens taken from a cache)."""

    def __init__(self):
        self.finish, self.stopped_by, self.counts = "length", None, (0, 0, 0)

    def take(self, kind: str, value) -> bool:
        """Keep (kind, value) if it is one of the ending's items: True, else False."""
        if kind == "finish":
            self.finish = value
        elif kind == "stop":
            self.stopped_by = value
        elif kind == "usage":
            self.counts = value
        else:
            return False
        return True


def _completion(llm, plan: _Plan, cancelled: Callable[[], bool] | None = None) -> dict:
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    end = _Ending()
    for kind, value in _events(llm, plan, cancelled):
        if not end.take(kind, value):
            parts[kind].append(value)
    finish = end.finish
    content, calls = _finish_tools(plan, "".join(parts["content"]))
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        finish = "length" if finish == "length" else "tool_calls"  # the calls cut at max
    if parts["reasoning"]:
        message["reasoning_content"] = "".join(parts["reasoning"]).strip()
    return {**_base(llm, "chat.completion"),
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish, **_stop_reason(finish, end.stopped_by)}],
            "usage": _usage(plan, end.counts)}


def _chunks(llm, plan: _Plan, cancelled: Callable[[], bool] | None = None) -> Iterator[dict]:
    base = _base(llm, "chat.completion.chunk")

    def chunk(delta: dict, finish: str | None = None, stop: dict | None = None,
              **extra: Any) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish, **(stop or {})}], **extra}

    yield chunk({"role": "assistant", "content": ""})
    held: list[str] = []
    end = _Ending()
    for kind, value in _events(llm, plan, cancelled):
        if end.take(kind, value):
            continue
        if kind == "reasoning":
            yield chunk({"reasoning_content": value})
        elif plan.tool_mode != "none":
            held.append(value)
        else:
            yield chunk({"content": value})
    finish = end.finish
    if plan.tool_mode != "none":
        content, calls = _finish_tools(plan, "".join(held))
        if calls:
            finish = "length" if finish == "length" else "tool_calls"
            yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
        if content:
            yield chunk({"content": content})
    yield chunk({}, finish, _stop_reason(finish, end.stopped_by),
                usage=_usage(plan, end.counts))


def _stop_reason(finish: str, stopped_by: str | None) -> dict:
    """vLLM's "stop_reason" for a choice that a stop string ended (none otherwise)."""
    return {"stop_reason": stopped_by} if finish == "stop" and stopped_by else {}


def create_chat_completion(llm, messages, tools=None, tool_choice=None, response_format=None,
                           stream: bool = False, max_tokens: int | None = None, stop=(),
                           enable_thinking: bool | None = None,
                           chat_template_kwargs: Mapping | None = None,
                           max_reasoning_tokens: int | None = None,
                           parallel_tool_calls: bool = True, **sampling):
    """See the module docstring."""
    stream = arguments.flag(stream, "stream")
    plan = plan_chat_completion(llm, messages, tools, tool_choice, response_format, max_tokens,
                                stop, enable_thinking, chat_template_kwargs,
                                max_reasoning_tokens, parallel_tool_calls, **sampling)
    return run_plan(llm, plan, stream)


def plan_chat_completion(llm, messages, tools=None, tool_choice=None, response_format=None,
                         max_tokens: int | None = None, stop=(),
                         enable_thinking: bool | None = None,
                         chat_template_kwargs: Mapping | None = None,
                         max_reasoning_tokens: int | None = None,
                         parallel_tool_calls: bool = True, **sampling) -> _Plan:
    """Everything create_chat_completion checks and prepares before the first token (its
    errors), as a plan: .ids is the prompt. The server plans on the LLM, then runs the plan
    on the slot that holds the longest prefix of .ids (run_plan)."""
    return _plan(llm, messages, tools, tool_choice, response_format, max_tokens, stop,
                 enable_thinking, chat_template_kwargs, max_reasoning_tokens, sampling,
                 parallel_tool_calls)


def run_plan(llm, plan: _Plan, stream: bool = False,
             cancelled: Callable[[], bool] | None = None):
    """The chat.completion dict of `plan` run on `llm` (chunk dicts with stream). Once
    `cancelled()` the generation ends after the token in progress (the answer so far), also
    where nothing is yielded meanwhile: a whole answer, a stream holding tool calls' text."""
    return _chunks(llm, plan, cancelled) if stream else _completion(llm, plan, cancelled)
