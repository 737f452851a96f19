"""Constrained decoding: JSON Schema, any JSON, regex, grammar or choices -> token masks.

The engine is llguidance (MIT; Earley parser over a derivative-based lexer, the token mask
computed on a trie of the vocabulary, a small share of a decode step): sampling only
sees a `Constraint`, which knows three things: the bitmask of the tokens allowed next
(int32 [ceil(V / 32)], llguidance's layout), `advance(token)`, and whether it is done.

    engine = ConstraintEngine(tokenizer_json, vocab_size, eos_ids)   # once per model
    c = engine.compile(spec_from(json_schema={...}))                 # ConstraintError if bad
    c.fill(); sample with c.mask; c.advance(token); ... until c.is_done() or EOS

The engine's tokenizer is built from the packed file's tokenizer.json; files converted from
GGUF carry the tokenizer.json the converter rebuilt from the GGUF token table
(converter/gguf_tokenizer.py), so every model file has one. Special tokens (chat markers)
are never allowed by a grammar, EOS only where the grammar may end.

`fill_async()` can compute the next mask in a worker thread while the model's forward runs
(llguidance releases the GIL, and so do our Numba kernels: nogil). Handing work to a thread
costs a GIL round trip, which on a busy 2-core machine is about as long as the mask itself:
benchmarks/constrained_decode.py measured it no faster with small or large vocabularies,
so it is off unless asked for (

Nothing reaches the engine unchecked (depth, size, valid Unicode: limits below, refused
with a ConstraintError naming the limit), and it compiles on a thread with a large stack, so
no schema or grammar can overflow a caller's stack. JSON schemas get bounds where they state
none (`bounded`), so that a sampled answer ends.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .. import arguments
from ..errors import ConstraintError

# Constrained JSON is written compactly, on one line with json.dumps's separators: free
# whitespace lets a sampled model spend its tokens on newlines and indentation. A schema's
# top-level "x-guidance" overrides it (llguidance's options: {"whitespace_flexible": true}
# for any whitespace, or a "whitespace_pattern").
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Bounds a schema gets unless it states its own, so that a sampled answer finishes:
# numbers up to 15 integer digits and 10 decimals (no exponent; llama.cpp's schema grammar
# bounds digits too), strings up to MAX_STRING characters, and objects that name their
# properties get no others (additionalProperties false, as vLLM's engines do); an object
# that names none takes any JSON, bounded so (keys up to MAX_KEY characters).
NUMBER_BOUND = 10 ** 15 - 1  # exact in a double, as llguidance reads bounds
NUMBER_STEP = 1e-10
MAX_STRING = 256
MAX_KEY = 64  # the names of properties an open object ({"type": "object"}) makes up
# What reaches the engine: its compiler recurses once per nesting level, $ref hop and rule
# reference, so these bound its stack; it runs on a thread with COMPILE_STACK bytes of stack
# (a server's worker threads have 1 MiB; a 300-deep $ref chain or a 1,000-terminal chain
# overflows that). Measured on a 256 MiB stack: 20,000-deep $ref and 60,000-rule chains
# compile; 100,000 rules overflow. MAX_GBNF_RULES: the GBNF converter's time grows with the
# square of its rules.
COMPILE_STACK = 256 << 20
MAX_SCHEMA_DEPTH = 100  # nested JSON objects and arrays (llguidance's JSON reader stops at 128)
MAX_SCHEMA_OBJECTS = 10_000
MAX_GRAMMAR_RULES = 10_000
MAX_GBNF_RULES = 2_000
_KINDS = ("response_format", "json_schema", "regex", "grammar", "choices")


@dataclass(frozen=True)
class ConstraintSpec:
    """A compiled-to-text llguidance grammar and what it came from (for error messages)."""

    kind: str  # "json_schema", "json", "regex", "grammar", "choices", "tools"
    grammar: str


def _first_line(message: str) -> str:
    lines = [ln.strip() for ln in str(message).split("<backtrace>")[0].splitlines()
             if ln.strip()]
    return lines[0] if lines else "invalid"


def _text(value: str, what: str) -> str:
    """value, if it is valid Unicode (the engine takes UTF-8: a lone surrogate is refused)."""
    return arguments.text(value, what, ConstraintError)


def check_schema(schema, what: str = "json_schema") -> None:
    """ConstraintError unless `schema` (JSON values) nests at most MAX_SCHEMA_DEPTH deep,
    holds at most MAX_SCHEMA_OBJECTS objects and only valid Unicode text. Iterative: a
    hostile depth meets no recursion here."""
    stack, objects = [(schema, 1)], 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _text(node, what)
            continue
        if isinstance(node, Mapping):
            objects += 1
            children = list(node.values())
            for key in node:
                if isinstance(key, str):
                    _text(key, what)
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise ConstraintError(f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels (the "
                                  "limit)")
        if objects > MAX_SCHEMA_OBJECTS:
            raise ConstraintError(f"{what} holds more than {MAX_SCHEMA_OBJECTS:,} objects "
                                  "(the limit)")
        stack.extend((c, depth + 1) for c in children)


# keywords whose value is a schema, a list of schemas or a map of schemas: what the output
# is made of ("not" and "if" are left as written: bounds inside them would widen the output)
_ONE = ("additionalProperties", "items", "then", "else", "contains",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


_VALUE = "edgellm_value"  # the $defs entry of a bounded "any JSON value"


def _any_value() -> dict:
    ref = {"$ref": f"#/$defs/{_VALUE}"}
    return {"anyOf": [
        {"type": "null"}, {"type": "boolean"},
        {"type": "number", "minimum": -NUMBER_BOUND, "maximum": NUMBER_BOUND,
         "multipleOf": NUMBER_STEP},
        {"type": "string", "maxLength": MAX_STRING},
        {"type": "array", "items": ref}, {"type": "object", **_open_object(ref)}]}


def _open_object(value: dict) -> dict:
    """An object's keywords for properties of any name up to MAX_KEY characters (keys the
    engine would leave unbounded) whose values follow `value`."""
    return {"patternProperties": {f"^.{{0,{MAX_KEY}}}$": value}, "additionalProperties": False}


def bounded(schema):
    """A copy of the schema document `schema` with the bounds above where it states none
    (a schema that states its own keeps them: additionalProperties true or a schema,
    maxLength, pattern, format, minimum, maximum, multipleOf). An object that names no
    properties ({"type": "object"}) and the empty schema take any JSON value with these
    bounds (a $defs entry of the root). Call check_schema first (this recurses)."""
    used: list[bool] = []
    out = _bound(schema, False, used)
    if used:
        out["$defs"] = {**out.get("$defs", {}), _VALUE: _any_value()}
    return out


def _bound(schema, in_all_of: bool, used: list):
    """bounded()'s walk; members of an allOf keep open objects (their intersection would
    otherwise allow no property of the other); `used` gets an item if the any-value is."""
    if schema is True or (isinstance(schema, Mapping) and not schema):
        used.append(True)
        return {"$ref": f"#/$defs/{_VALUE}"}
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), Mapping) or out.get(key) is True:
            out[key] = _bound(out[key], False, used)
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [_bound(s, key == "allOf", used) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _bound(s, False, used) for k, s in out[key].items()}
    kinds = out.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds}
    if "enum" in out or "const" in out:
        return out
    if not in_all_of and "object" in kinds | ({"object"} if "properties" in out else set()) \
            and not any(k in out for k in ("additionalProperties", "patternProperties",
                                           "unevaluatedProperties")):
        if isinstance(out.get("properties"), Mapping):
            out["additionalProperties"] = False
        else:
            used.append(True)
            out.update(_open_object({"$ref": f"#/$defs/{_VALUE}"}))
    if kinds & {"integer", "number"}:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -NUMBER_BOUND
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = NUMBER_BOUND
        if "number" in kinds and "multipleOf" not in out:
            out["multipleOf"] = NUMBER_STEP
    if "string" in kinds and not any(k in out for k in ("maxLength", "pattern", "format")):
        out["maxLength"] = MAX_STRING
    return out


def json_grammar(schema: Mapping | str | bool, what: str = "json_schema") -> str:
    """llguidance grammar text for a JSON schema (checked, bounded, compact)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    check_schema(schema, what)
    try:
        # as text: the engine reads a Python int beyond 64 bits as no JSON at all
        return _llg().LLMatcher.grammar_from_json_schema(
            json.dumps(bounded(schema), ensure_ascii=False), defaults=_layout(schema))
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"{what} is not valid JSON: {_first_line(e)}") from None


def _layout(schema) -> dict:
    """JSON_LAYOUT, or none of it where the schema's x-guidance sets the whitespace itself
    (its separators would still demand our spaces)."""
    guide = schema.get("x-guidance") if isinstance(schema, Mapping) else None
    if isinstance(guide, Mapping) and ("whitespace_flexible" in guide
                                       or "whitespace_pattern" in guide):
        return {}
    return JSON_LAYOUT


_GBNF_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z][\w-]*[ \t]*::=")
_LARK_RULE = re.compile(r"(?m)^[ \t]*[?!]?[A-Za-z_][\w.]*(\[[^\]\n]*\])?[ \t]*:")
_EMBEDDED_JSON = re.compile(r"%json\s*(?=\{)")


def lark_grammar(grammar: str, what: str = "grammar") -> str:
    """llguidance grammar text for a Lark grammar or a llama.cpp GBNF one (`::=` rules),
    refused past MAX_GBNF_RULES / MAX_GRAMMAR_RULES rules; schemas in it (%json) checked."""
    from llguidance.gbnf_to_lark import any_to_lark, is_lark_syntax

    _text(grammar, what)
    if not is_lark_syntax(grammar) and len(_GBNF_RULE.findall(grammar)) > MAX_GBNF_RULES:
        raise ConstraintError(f"{what} has more than {MAX_GBNF_RULES:,} GBNF rules (the limit)")
    try:
        lark = any_to_lark(grammar)
    except Exception as e:  # the GBNF converter raises what its parser hits
        raise ConstraintError(f"{what}: cannot read it as GBNF: {_first_line(e)}") from None
    if len(_LARK_RULE.findall(lark)) > MAX_GRAMMAR_RULES:
        raise ConstraintError(f"{what} has more than {MAX_GRAMMAR_RULES:,} rules (the limit)")
    for m in _EMBEDDED_JSON.finditer(lark):
        try:
            schema, _ = json.JSONDecoder().raw_decode(lark, m.end())
        except (ValueError, RecursionError):
            continue  # the engine reports it, with its line
        check_schema(schema, f"{what}'s %json schema")
    return _llg().LLMatcher.grammar_from_lark(lark)


def spec_from(response_format: Mapping | None = None, json_schema: Mapping | str | None = None,
              regex: str | None = None, grammar: str | None = None,
              choices: Sequence[str] | None = None) -> ConstraintSpec | None:
    """The constraint the arguments ask for (at most one of them), or None."""
    given = [k for k, v in zip(_KINDS, (response_format, json_schema, regex, grammar, choices))
             if v is not None]
    if len(given) > 1:
        raise ConstraintError(f"give at most one constraint, got {', '.join(given)}")
    if response_format is not None:
        return _response_format(response_format)
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(_text(json_schema, "json_schema"))
            except RecursionError:
                raise ConstraintError(f"json_schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                      "levels (the limit)") from None
            except ValueError as e:
                raise ConstraintError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(json_schema, (Mapping, bool)):
            raise ConstraintError("json_schema must be a JSON Schema object")
        return ConstraintSpec("json_schema", json_grammar(json_schema))
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ConstraintError("regex must be a non-empty string")
        return ConstraintSpec("regex", _llg().LLMatcher.grammar_from_regex(_text(regex,
                                                                                 "regex")))
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ConstraintError("grammar must be a non-empty string (Lark or GBNF)")
        return ConstraintSpec("grammar", lark_grammar(grammar))
    if choices is not None:
        if isinstance(choices, str) or not all(isinstance(c, str) and c for c in choices) \
                or not choices:
            raise ConstraintError("choices must be a non-empty list of non-empty strings")
        # one terminal (one lexeme): a rule of 20,000 alternatives overflows the parser's
        # row of items at the first token, and 65,535 is its symbol limit
        lark = "start: CHOICE\nCHOICE: " + " | ".join(
            json.dumps(_text(c, f"choices[{i}]")) for i, c in enumerate(choices))
        return ConstraintSpec("choices", _llg().LLMatcher.grammar_from_lark(lark))
    return None


def _response_format(rf: Mapping) -> ConstraintSpec | None:
    """OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", ...}
    (and llama-cpp-python's {"type": "json_object", "schema": {...}})."""
    if not isinstance(rf, Mapping):
        raise ConstraintError("response_format must be an object with a 'type'")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema", {"type": "object"})
        return ConstraintSpec("json", json_grammar(schema, "response_format"))
    if kind == "json_schema":
        inner = rf.get("json_schema")
        if not isinstance(inner, Mapping) or "schema" not in inner:
            raise ConstraintError("response_format.json_schema must be an object with a "
                                  "'schema'")
        schema = inner["schema"]
        if not isinstance(schema, (Mapping, bool)):
            raise ConstraintError("response_format.json_schema.schema must be an object")
        return ConstraintSpec("json_schema", json_grammar(schema, "response_format"))
    raise ConstraintError(f"response_format.type must be 'text', 'json_object' or "
                          f"'json_schema', got {kind!r}")


def _llg():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a runtime dependency
        raise ConstraintError("constrained decoding needs the llguidance package "
                              "(pip install llguidance)") from None
    return llguidance


_WORKER: ThreadPoolExecutor | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgellm-mask")
        return _WORKER


class ConstraintEngine:
    """llguidance's tokenizer for one model (built once: its cost grows with the vocabulary)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Iterable[int]):
        llg = _llg()
        eos = sorted(int(i) for i in eos_ids)
        if not eos:
            raise ConstraintError("constrained decoding needs an end-of-sequence token; the "
                                  "model's tokenizer names none")
        try:
            self.tokenizer = llg.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                             eos_token=eos)
        except Exception as e:  # llguidance raises ValueError/RuntimeError from Rust
            raise ConstraintError(f"the constraint engine cannot read the model's "
                                  f"tokenizer: {_first_line(e)}") from None
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos)

    def token_id(self, text: str) -> int | None:
        """The id of a special token whose text is `text` (e.g. "<tool_call>"), else None."""
        ids = self.tokenizer.tokenize_str(text, parse_special=True)
        if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]):
            return ids[0]
        return None

    def compile(self, spec: ConstraintSpec, overlap: bool = False) -> Constraint:
        """A fresh Constraint for `spec`; ConstraintError naming the problem if the engine
        refuses it (unsupported keyword, grammar line and column). overlap: compute masks
        in a worker thread during the forward (measured no faster here: off by default).
        The engine compiles on a thread of its own with COMPILE_STACK bytes of stack."""
        return _on_big_stack(self._compile, spec, overlap)

    def _compile(self, spec: ConstraintSpec, overlap: bool) -> Constraint:
        llg = _llg()
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(
            spec.grammar, self.tokenizer)
        if is_error:
            raise ConstraintError(_describe(spec.kind, messages[0] if messages else ""))
        matcher = llg.LLMatcher(self.tokenizer, spec.grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintError(_describe(spec.kind, matcher.get_error()))
        constraint = Constraint(matcher, self.vocab_size, spec.kind, overlap)
        constraint.fill()  # the first mask: a grammar whose language is empty stops here
        if matcher.is_error():  # (e.g. the regex [^\s\S]: it had ended as an empty "stop")
            raise ConstraintError(f"{_WHAT.get(spec.kind, spec.kind)} matches no output at "
                                  "all: no text can satisfy it")
        return constraint


_STACK_LOCK = threading.Lock()


def _on_big_stack(fn, *args):
    """fn(*args) run on a new thread with COMPILE_STACK bytes of stack (reserved address
    space: only the pages the recursion touches are used), its exception re-raised here.
    The caller's thread may have 1 MiB (a server's workers), too little for the engine's
    compiler on schemas and grammars within our limits."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    with _STACK_LOCK:  # the stack size is process-wide: set it for this thread only
        old = threading.stack_size(COMPILE_STACK)
        try:
            thread = threading.Thread(target=run, name="edgellm-compile", daemon=True)
            thread.start()
        except RuntimeError as e:
            raise ConstraintError(f"cannot start the constraint compiler's thread: {e}") \
                from None
        finally:
            threading.stack_size(old)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _describe(kind: str, message: str) -> str:
    """One line: which constraint, and llguidance's message without its source excerpts
    ("at 2(4): unknown name" for grammars, where 2(4) is line 2, column 4, becomes
    "line 2, column 4: unknown name"; 'Unimplemented keys: ["if"]' for schemas)."""
    lines = [ln.strip() for ln in str(message).split("<backtrace>")[0].splitlines()]
    lines = [ln for ln in lines if ln and not re.match(r"^(\d+ \|.*|\^+)$", ln)]
    text = " ".join(lines) or "invalid"
    if len(text) > 300:  # the engine quotes the input (a regex of any length)
        text = text[:300] + "..."
    text = re.sub(r"^panic: ", "the engine failed: ", text)
    m = re.match(r"at (\d+)\((\d+)\): ", text)
    if m:
        where = "" if kind in ("regex", "choices") else \
            f"line {m.group(1)}, column {m.group(2)}: "
        text = where + text[m.end():]
    return f"{_WHAT.get(kind, kind)} is not supported: {text}"


_WHAT = {"json": "response_format", "json_schema": "json_schema", "tools": "tool schema"}


class Constraint:
    """One generation's grammar state and its token mask.

    mask: int32 [ceil(V / 32)], the tokens allowed next (valid after fill() / wait()).
    """

    def __init__(self, matcher, vocab_size: int, kind: str, overlap: bool = False):
        self._m = matcher
        self.kind = kind
        self.mask = np.zeros((vocab_size + 31) // 32, np.int32)
        self.overlap = overlap
        self._pending: Future | None = None
        self._fresh = False  # mask is the current state's (compile's first: not again)

    def _fill_now(self) -> None:
        self._m.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)
        self._fresh = True

    def fill(self) -> None:
        """Compute the mask of the tokens allowed next (blocking)."""
        self.wait()
        if not self._fresh:
            self._fill_now()

    def fill_async(self) -> None:
        """Start computing the next mask (in a worker thread if `overlap`); wait() for it."""
        self.wait()
        if self._fresh:
            return
        if self.overlap:
            self._pending = _worker().submit(self._fill_now)
        else:
            self._fill_now()

    def wait(self) -> None:
        """Block until a mask started by fill_async() is ready."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def advance(self, token: int) -> None:
        """Consume a sampled token (one the mask allowed)."""
        self.wait()
        self._fresh = False
        if not self._m.consume_token(int(token)):
            raise ConstraintError(f"token {token} is not allowed by the {self.kind} constraint"
                                  f": {_first_line(self._m.get_error())}")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, consumed in turn from the current state, the grammar allows
        (the state unchanged)."""
        self.wait()
        return int(self._m.validate_tokens([int(t) for t in tokens]))

    def is_done(self) -> bool:
        """The grammar is complete and can take nothing more (only EOS)."""
        return self._m.is_stopped()

    def is_accepting(self) -> bool:
        """The output so far is complete (EOS is allowed)."""
        return self._m.is_accepting()
