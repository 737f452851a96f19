"""Constrained decoding: JSON Schema, any JSON, regex, grammar or choices -> token masks.

The engine is llguidance (MIT; Earley parser over a derivative-based lexer, the token mask
computed on a trie of the vocabulary, ~50 us per token at 128k vocabularies): sampling only
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
costs a GIL round trip, which on a busy 2-core machine is about as long as the mask itself
(40-80 us at 49k-262k tokens): benchmarks/constrained_decode.py measured it no faster at
either size, so it is off unless asked for (`Constraint.overlap`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .errors import ConstraintError

# JSON whitespace between tokens: JSON's own set, at most a few characters at a time, so a
# sampled run of blanks cannot fill max_tokens (llguidance's default is unbounded).
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,8}"
_KINDS = ("response_format", "json_schema", "regex", "grammar", "choices")


@dataclass(frozen=True)
class ConstraintSpec:
    """A compiled-to-text llguidance grammar and what it came from (for error messages)."""

    kind: str  # "json_schema", "json", "regex", "grammar", "choices", "tools"
    grammar: str


def _first_line(message: str) -> str:
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    return lines[0] if lines else "invalid"


def json_grammar(schema: Mapping | str | bool) -> str:
    """llguidance grammar text for a JSON schema (bounded whitespace between tokens)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    try:
        return _llg().LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_pattern": JSON_WHITESPACE})
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"json_schema is not valid JSON: {_first_line(e)}") from None


def lark_grammar(grammar: str) -> str:
    """llguidance grammar text for a Lark grammar or a llama.cpp GBNF one (`::=` rules)."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(grammar)
    except Exception as e:  # the GBNF converter raises what its parser hits
        raise ConstraintError(f"grammar: cannot read it as GBNF: {_first_line(e)}") from None
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
                json_schema = json.loads(json_schema)
            except ValueError as e:
                raise ConstraintError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(json_schema, (Mapping, bool)):
            raise ConstraintError("json_schema must be a JSON Schema object")
        return ConstraintSpec("json_schema", json_grammar(json_schema))
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ConstraintError("regex must be a non-empty string")
        return ConstraintSpec("regex", _llg().LLMatcher.grammar_from_regex(regex))
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ConstraintError("grammar must be a non-empty string (Lark or GBNF)")
        return ConstraintSpec("grammar", lark_grammar(grammar))
    if choices is not None:
        if isinstance(choices, str) or not all(isinstance(c, str) and c for c in choices) \
                or not choices:
            raise ConstraintError("choices must be a non-empty list of non-empty strings")
        lark = "start: " + " | ".join(json.dumps(c) for c in choices)
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
        return ConstraintSpec("json", json_grammar(schema))
    if kind == "json_schema":
        inner = rf.get("json_schema")
        if not isinstance(inner, Mapping) or "schema" not in inner:
            raise ConstraintError("response_format.json_schema must be an object with a "
                                  "'schema'")
        schema = inner["schema"]
        if not isinstance(schema, (Mapping, bool)):
            raise ConstraintError("response_format.json_schema.schema must be an object")
        return ConstraintSpec("json_schema", json_grammar(schema))
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
    """llguidance's tokenizer for one model (built once: ~ms at 49k tokens, ~0.1 s at 262k)."""

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
        in a worker thread during the forward (measured no faster here: off by default)."""
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


def _describe(kind: str, message: str) -> str:
    """One line: which constraint, and llguidance's message without its source excerpts
    ("at 2(4): unknown name" for grammars, where 2(4) is line 2, column 4, becomes
    "line 2, column 4: unknown name"; 'Unimplemented keys: ["if"]' for schemas)."""
    lines = [ln.strip() for ln in str(message).splitlines()]
    lines = [ln for ln in lines if ln and not re.match(r"^(\d+ \|.*|\^+)$", ln)]
    text = " ".join(lines) or "invalid"
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

    def is_done(self) -> bool:
        """The grammar is complete and can take nothing more (only EOS)."""
        return self._m.is_stopped()

    def is_accepting(self) -> bool:
        """The output so far is complete (EOS is allowed)."""
        return self._m.is_accepting()
