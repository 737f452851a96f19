"""Tool calls: the format a chat template uses, the grammar that forces a call, the parser.

Formats, recognized from the template's source (as llama.cpp's chat parsers do):

| format  | a call in the output                                            | templates         |
|---------|-----------------------------------------------------------------|-------------------|
| hermes  | <tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>       | Qwen2.5/3, Hermes |
| llama3  | [<|python_tag|>]{"name": N, "parameters": {...}}                | Llama 3.1-3.3     |
| mistral | [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] or           | Mistral           |
|         | [TOOL_CALLS]N[ARGS]{...}                                        |                   |
| generic | {"tool_calls": [{"name": N, "arguments": {...}}, ...]}           | any other (SmolLM2)|

Templates that take no `tools` (generic) get the tools described in the system message.
`parse(text, fmt)` returns the text outside the calls and the calls; a call that does not
parse stays in the text, a call that repeats an earlier one is dropped, and the complete
calls of a list cut short (at max_tokens) are kept. `grammar(tools, fmt, choice, engine)`
is the llguidance grammar for tool_choice "required" or a named function (a lazy one for
"auto": free text until the model opens a call, then the call's schema); the arguments'
schemas get the bounds and the compact layout of constraints.py. `Repeats` watches an
answer as it comes and says when a call repeats an earlier one: the list ends there (a
sampled model otherwise repeats its one call until max_tokens).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ArgumentError, ConstraintError
from .constraints import JSON_LAYOUT, bounded, check_schema

FORMATS = ("hermes", "llama3", "mistral", "generic")
CALL_WHITESPACE = r"[ \n]{0,2}"  # between calls: `{"tool_calls": [{...}, {...}]}`
GENERIC_INSTRUCTIONS = (
    "You can call these tools (JSON Schema of each function's parameters):\n{tools}\n"
    "To call tools, answer with only a JSON object of this form, and nothing else:\n"
    '{{"tool_calls": [{{"name": "<function name>", "arguments": {{<its arguments>}}}}]}}\n'
    "Otherwise answer normally.")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Any  # usually a dict

    def to_openai(self) -> dict:
        return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": self.name,
                             "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


def detect_format(template: str | None) -> str:
    """The tool-call format a chat template's source uses ("generic" if it takes no tools)."""
    src = template or ""
    if "<tool_call>" in src:
        return "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or (re.search(r"\btools\b", src) and '"parameters"' in src):
        return "llama3"
    return "generic"


def check_tools(tools: Any) -> list[dict]:
    """OpenAI's [{"type": "function", "function": {"name", "description"?, "parameters"?}}]."""
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        raise ConstraintError("tools must be a list of {'type': 'function', 'function': ...}")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" \
                or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise ConstraintError(f"tools[{i}] must be {{'type': 'function', 'function': "
                                  "{'name': ..., 'parameters': {...}}}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise ConstraintError(f"tools[{i}].function.parameters must be a JSON Schema object")
        out.append({"type": "function", "function": {**fn, "parameters": dict(params)}})
    check_schema(out, "tools")  # together: they become one grammar and one system message
    return out


def chosen(tools: list[dict], tool_choice: Any) -> tuple[str, list[dict]]:
    """(mode, tools the output may call): mode "none", "auto" or "required"."""
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if isinstance(tool_choice, str) and tool_choice in ("none", "auto", "required"):
        if tool_choice != "none" and not tools:
            raise ConstraintError(f"tool_choice {tool_choice!r} needs tools")
        return tool_choice, tools
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str):
            raise ConstraintError("tool_choice must name a function: {'type': 'function', "
                                  "'function': {'name': ...}}")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise ConstraintError(f"tool_choice names function {name!r}, which is not in tools")
        return "required", picked
    raise ConstraintError("tool_choice must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}")


# -- messages ------------------------------------------------------------------------
def prepare_messages(messages: Sequence[Mapping], tools: list[dict] | None,
                     fmt: str) -> list[dict]:
    """Messages as the template wants them: assistant tool_calls with arguments as dicts
    (HF templates run `tojson` on them); for the generic format, the tools described in the
    system message and earlier calls written as the JSON the model is asked for."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for j, c in enumerate(calls):
                fn = c.get("function", c) if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise ArgumentError(f"messages[{i}].tool_calls[{j}] must be "
                                        "{'function': {'name': str, 'arguments': ...}}")
                fn = dict(fn)
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                fixed.append({**c, "function": fn})
            m["tool_calls"] = fixed
            if fmt == "generic":
                body = [{"name": c["function"]["name"],
                         "arguments": c["function"].get("arguments", {})} for c in fixed]
                m = {"role": "assistant", "content": json.dumps({"tool_calls": body})}
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    if fmt == "generic" and tools:
        described = GENERIC_INSTRUCTIONS.format(tools="\n".join(
            json.dumps(t["function"], ensure_ascii=False) for t in tools))
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


# -- grammar -------------------------------------------------------------------------
def _arguments(params: dict, i: int) -> dict:
    """A tool's parameters as a schema resource of its own ($id): its "#/$defs/..." refs
    (pydantic's nested models) resolve in it, not in the call object around it."""
    return {"$id": f"urn:edgellm:tool:{i}", **bounded(params)}


def _call_schema(tools: list[dict], key: str) -> dict:
    options = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        key: _arguments(t["function"]["parameters"], i)}, "required": ["name", key],
        "additionalProperties": False} for i, t in enumerate(tools)]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _array(item: dict, parallel: bool = True) -> dict:
    return {"type": "array", "items": item, "minItems": 1, **({} if parallel else
                                                              {"maxItems": 1})}


def grammar(tools: list[dict], fmt: str, mode: str, special_id,
            parallel: bool = True) -> str | None:
    """llguidance grammar text: a call is required ("required") or may start anywhere in
    free text ("auto": lazy, constrained from the call's opening on; None where the format
    has no opening marker to wait for: Llama 3 JSON without <|python_tag|>).
    special_id(text) -> id if `text` is one special token of the model, else None.
    parallel: several calls in one answer (else exactly one)."""
    def lit(text: str) -> str:
        sid = special_id(text)
        return f"<[{sid}]>" if sid is not None else json.dumps(text)

    call = _call_schema(tools, "parameters" if fmt == "llama3" else "arguments")
    item = _array(call, parallel) if fmt == "mistral" else call
    more = ' (WS "," WS call_json)*' if parallel else ""
    after = {"hermes": f'"\\n" call_json "\\n" {lit("</tool_call>")}',
             "mistral": "call_json", "llama3": "call_json",
             "generic": f'WS ":" WS "[" call_json{more} WS "]" WS "}}"'}[fmt]
    trigger = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": "<|python_tag|>",
               "generic": '{"tool_calls"'}[fmt]
    rules = [f"call_json: %json {json.dumps({**item, 'x-guidance': JSON_LAYOUT})}",
             f"WS: /{CALL_WHITESPACE}/"]
    no_marker = fmt == "llama3" and special_id(trigger) is None
    if mode == "required":
        body = "call_json" if no_marker else f"{lit(trigger)} {after}"
        head = [f"start: call{'+' if parallel else ''}", f'call: {body} "\\n"?'] \
            if fmt == "hermes" else ["start: call", f"call: {body}"]
    elif no_marker:
        return None
    elif special_id(trigger) is not None:  # a special token never occurs inside TEXT
        head = ["start: call* TEXT", f"call: TEXT {lit(trigger)} {after}"]
    else:  # llguidance's lazy lexeme: free text up to the first occurrence of the trigger
        head = ["start: call* TEXT", f"call: call_trig {after}",
                f"call_trig[lazy]: TEXT {json.dumps(trigger)}"]
    tail = ["TEXT: /(.|\\n)*/"] if mode != "required" else []
    return "%llguidance {}\n" + "\n".join(head + rules + tail) + "\n"


# -- parsing -------------------------------------------------------------------------
_DECODER = json.JSONDecoder()


def _as_call(obj: Any, key: str = "arguments") -> Call | None:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(key, obj.get("arguments", obj.get("parameters")))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, Mapping):
        return None
    return Call(obj["name"], dict(args))


def _json_at(text: str, i: int) -> tuple[Any, int] | None:
    try:
        return _DECODER.raw_decode(text, i)
    except ValueError:
        return None


def parse(text: str, fmt: str) -> tuple[str, list[Call]]:
    """(content outside the calls, calls) found in model output `text`; a call equal to an
    earlier one (name and arguments) is dropped."""
    content, calls = _PARSERS[fmt](text)
    unique, seen = [], set()
    for c in calls:
        key = _key(c)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return content, unique


def _key(call: Call) -> tuple[str, str]:
    return call.name, json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)


class Repeats:
    """Fed an answer's text as it comes, `feed` is true once a complete call equals an
    earlier one: the call list ends there."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.parts: list[str] = []

    def feed(self, piece: str) -> bool:
        self.parts.append(piece)
        if "}" not in piece and ">" not in piece:  # no call can have ended here
            return False
        calls = _PARSERS[self.fmt]("".join(self.parts))[1]
        return len({_key(c) for c in calls}) < len(calls)


def _array_items(text: str, i: int) -> tuple[list, int, bool]:
    """The complete items of the JSON array opening at text[i] ("["): (items, end of the
    last one, whether the array closed). A list cut short keeps its complete items."""
    items, j = [], i + 1
    while True:
        while text[j:j + 1].isspace():
            j += 1
        if text[j:j + 1] == "]":
            return items, j + 1, True
        got = _json_at(text, j)
        if got is None:
            return items, j, False
        items.append(got[0])
        end = j = got[1]
        while text[j:j + 1].isspace():
            j += 1
        if text[j:j + 1] == ",":
            j += 1
        elif text[j:j + 1] == "]":
            return items, j + 1, True
        else:
            return items, end, False


def _parse_hermes(text: str) -> tuple[str, list[Call]]:
    calls, kept, pos, cut = [], [], 0, None
    for m in re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S):
        got = _json_at(m.group(1), 0)
        call = _as_call(got[0]) if got and not m.group(1)[got[1]:].strip() else None
        if call is None:
            cut = m.start() if m.end() == len(text) and "</tool_call>" not in m.group(0) \
                else None  # an unclosed call at the end: one cut short
            continue
        calls.append(call)
        kept.append(text[pos:m.start()])
        pos = m.end()
    kept.append(text[pos:cut])
    return "".join(kept).strip() if calls else text, calls


def _scan_objects(text: str, start: int, to_call) -> tuple[str, list[Call]]:
    """Calls from JSON objects anywhere in text[start:] that to_call accepts."""
    calls, kept, pos, i = [], [text[:start]], start, start
    while (i := text.find("{", i)) >= 0:
        got = _json_at(text, i)
        found = to_call(got[0]) if got else None
        if not found:
            i += 1
            continue
        calls.extend(found)
        kept.append(text[pos:i])
        pos = i = got[1]
        if text[pos:pos + 1] == ";":  # Llama 3 separates several calls with ";"
            pos = i = pos + 1
    kept.append(text[pos:])
    return "".join(kept).strip() if calls else text, calls


def _parse_llama3(text: str) -> tuple[str, list[Call]]:
    start = text.find("<|python_tag|>")
    body = text if start < 0 else text[:start] + text[start + len("<|python_tag|>"):]

    def to_call(obj: Any) -> list[Call] | None:
        if isinstance(obj, Mapping) and ("parameters" in obj or "arguments" in obj):
            call = _as_call(obj, "parameters")
            return [call] if call else None
        return None

    content, calls = _scan_objects(body, 0, to_call)
    return (content, calls) if calls else (text, [])


def _parse_mistral(text: str) -> tuple[str, list[Call]]:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return text, []
    calls, i = [], start
    while text.startswith("[TOOL_CALLS]", i):
        i += len("[TOOL_CALLS]")
        if text[i:i + 1] == "[":  # v3/v7: a JSON array of calls (cut short: its complete ones)
            items, i, closed = _array_items(text, i)
            found = [_as_call(o) for o in items]
            if not found or None in found:
                return text, []
            calls.extend(found)
            if not closed:
                return text[:start].strip(), calls
        else:  # v11+: name[ARGS]{...}
            m = re.match(r"([^\[\]{}\s]+)\[ARGS\]", text[i:])
            got = _json_at(text, i + m.end()) if m else None
            if not got or not isinstance(got[0], Mapping):
                return text, []
            calls.append(Call(m.group(1), dict(got[0])))
            i = got[1]
        while text[i:i + 1].isspace():
            i += 1
    return (text[:start] + text[i:]).strip(), calls


def _parse_generic(text: str) -> tuple[str, list[Call]]:
    def to_call(obj: Any) -> list[Call] | None:
        if not isinstance(obj, Mapping):
            return None
        if isinstance(obj.get("tool_calls"), list):
            found = [_as_call(o) for o in obj["tool_calls"]]
            return found if found and None not in found else None
        if isinstance(obj.get("tool_call"), Mapping):
            call = _as_call(obj["tool_call"])
            return [call] if call else None
        return None

    content, calls = _scan_objects(text, 0, to_call)
    m = re.search(r'\{\s*"tool_calls"\s*:\s*\[', content)
    if m:  # a list cut short (at max_tokens, or where a call repeated): its complete calls
        found = [_as_call(o) for o in _array_items(content, m.end() - 1)[0]]
        if found and None not in found:
            return content[:m.start()].strip(), calls + found
    return content, calls


_PARSERS = {"hermes": _parse_hermes, "llama3": _parse_llama3, "mistral": _parse_mistral,
            "generic": _parse_generic}
