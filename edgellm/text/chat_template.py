"""Chat templates: render a conversation to prompt text exactly as transformers does.

`apply_chat_template` in transformers compiles the model's Jinja template in an
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the loop-control
and `{% generation %}` extensions, its own `tojson` filter and the globals `raise_exception`
and `strftime_now`, and renders it with `messages`, `tools`, `documents`,
`add_generation_prompt` and the special tokens. `ChatTemplate` does the same.

Time: the deadline is checked at every attribute, item, call, filter and operator, and,
as those need not occur in a loop (`{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}`
over a range stored in a variable runs none), at every iteration of every loop, every
loop filter test and every macro entry: `_Sandbox._generate` adds the check to the
template's syntax tree before it is compiled. No construct runs long between two checks:
the C functions a template can reach work on values bounded in size (strings and lists of
MAX_CHARS, ranges of 100,000, ints of MAX_POW_BITS).

Templates ship with model files, so they are untrusted: the sandbox refuses Python internals
(`''.__class__`), and rendering is bounded in output size, value sizes and time, so a
template cannot eat the memory or the CPU (`{% for i in range(10**9) %}` fails). Beyond the
checks on what a template builds, one call can still ask a C function for gigabytes
(`tojson(indent=10**8)`, `replace` with a long string, `expandtabs`): on Linux, rendering
runs with RLIMIT_DATA at the process's private memory plus MAX_BYTES, so such a call fails
with MemoryError (a TemplateError) instead of exhausting the machine. The limit is the
process's: another thread allocating during a render shares the allowance.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from edgellm.errors import TemplateError

MAX_CHARS = 1_000_000  # rendered output, and any string/list a template builds
MAX_SECONDS = 10.0
MAX_BYTES = 256 << 20  # memory a render may allocate (Linux: see memory_cap)
MAX_POW_BITS = 4096
# widths and precisions in "%10.3f" and "{:>10}" format strings
_FORMAT_WIDTHS = re.compile(r"%[-#0 +]*\d*(?:\.\d*)?|\{[^{}]*?:[^{}]*\}")
_STAR_WIDTH = re.compile(r"%[-#0 +]*\d*\.?\*")
# functions whose int arguments are sizes of what they build
_WIDTH_FILTERS = frozenset({"center", "indent", "batch", "slice", "wordwrap"})
_WIDTH_STR_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


class _Raised(Exception):
    """raise_exception() was called by the template."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; for rendering it is transparent."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: Any) -> None:
    raise _Raised(str(message))


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # transformers' override: no HTML escaping, and these keyword arguments.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Sandbox(ImmutableSandboxedEnvironment):
    """The transformers environment plus limits on time, on the size of every value the
    template builds, and on the widths it asks of padding functions."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, max_chars: int, max_seconds: float) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[loopcontrols, _GenerationTag])
        self.max_chars = max_chars
        self.max_seconds = max_seconds
        self.deadline = math.inf
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        del self.globals["lipsum"]  # slow and useless in a chat template
        for name, fn in list(self.filters.items()):
            self.filters[name] = self._guarded(fn, name in _WIDTH_FILTERS)

    # -- limits
    def _tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template took longer than {self.max_seconds:g} s")

    @property
    def loop_tick(self) -> bool:
        """Read by every loop iteration, loop filter and macro body (see _generate): a
        property, so the check costs an attribute read, not a sandboxed call."""
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template took longer than {self.max_seconds:g} s")
        return True

    def _generate(self, source: nodes.Template, *args: Any, **kwargs: Any) -> str:
        """Compile `source` with a deadline check in every loop body, loop filter and
        macro body (an internal node: a template cannot name or shadow it)."""
        def check() -> nodes.EnvironmentAttribute:
            return nodes.EnvironmentAttribute("loop_tick")

        for node in source.find_all((nodes.For, nodes.Macro, nodes.CallBlock)):
            node.body.insert(0, nodes.ExprStmt(check()))
            if isinstance(node, nodes.For) and node.test is not None:
                node.test = nodes.And(check(), node.test)
        return super()._generate(source, *args, **kwargs)

    def _check_size(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple, dict)) and len(value) > self.max_chars:
            raise TemplateError(f"chat template built a value longer than {self.max_chars}")
        return value

    def _check_widths(self, values: Iterable[Any]) -> None:
        for value in values:
            if isinstance(value, int) and abs(value) > self.max_chars:
                raise TemplateError(f"chat template asked for a width above {self.max_chars}")

    def _check_format(self, fmt: str, args: Any = ()) -> None:
        for match in _FORMAT_WIDTHS.finditer(fmt):
            self._check_widths(int(n) for n in re.findall(r"\d+", match.group()))
        if _STAR_WIDTH.search(fmt):  # "%*s" takes its width from the arguments
            self._check_widths(args if isinstance(args, tuple) else (args,))

    def _guarded(self, fn: Any, widths: bool) -> Any:
        # jinja passes (context or environment,) value, then the filter's own arguments
        skip = 2 if getattr(fn, "jinja_pass_arg", None) else 1

        @functools.wraps(fn)  # keeps jinja's pass_context / pass_environment marks
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self._tick()
            if widths:
                self._check_widths((*args[skip:], *kwargs.values()))
            return self._check_size(fn(*args, **kwargs))
        return guarded

    # -- sandbox hooks
    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise TemplateError(f"chat template tried to access attribute {attribute!r} of "
                            f"{type(obj).__name__!r} object: refused")

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)  # "...".format / format_map
        if wrapped is not None:
            self._check_format(value.__self__)
        return wrapped

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._tick()
        return self._check_size(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        self._tick()
        return self._check_size(super().getitem(obj, argument))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self._tick()
        if isinstance(getattr(__obj, "__self__", None), str) \
                and getattr(__obj, "__name__", "") in _WIDTH_STR_METHODS:
            __self._check_widths((*args, *kwargs.values()))
        return __self._check_size(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        sized = (str, list, tuple)
        if operator == "*":
            seq, n = (left, right) if isinstance(left, sized) else (right, left)
            if isinstance(seq, sized) and isinstance(n, int) and len(seq) * n > self.max_chars:
                raise TemplateError(f"chat template built a value longer than {self.max_chars}")
            if isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() + right.bit_length() > MAX_POW_BITS:
                raise TemplateError("chat template computed a number too large")
        elif operator == "**":
            if isinstance(left, (int, float)) and isinstance(right, int) and abs(left) > 1 \
                    and right * math.log2(abs(left)) > MAX_POW_BITS:
                raise TemplateError("chat template computed a number too large")
        elif operator == "%":
            if isinstance(left, str):
                self._check_format(left, right)
        elif isinstance(left, sized) and isinstance(right, sized):
            if len(left) + len(right) > self.max_chars:
                raise TemplateError(f"chat template built a value longer than {self.max_chars}")
        return self._check_size(super().call_binop(context, operator, left, right))


def _private_bytes() -> int:
    """The process's private writable memory (VmData), as RLIMIT_DATA counts it."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmData in /proc/self/status")


@contextlib.contextmanager
def memory_cap(extra_bytes: int) -> Iterator[None]:
    """Within the block, allocations past the current private memory plus `extra_bytes`
    fail with MemoryError (Linux: RLIMIT_DATA; elsewhere, no limit). Restored after."""
    if not sys.platform.startswith("linux") or extra_bytes <= 0:
        yield
        return
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = _private_bytes() + extra_bytes
    except (ImportError, OSError, ValueError):
        yield
        return
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:  # already at least as tight
        yield
        return
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _map_strings(value: Any, fn) -> Any:
    """value with fn applied to every str in it (dict values, list and tuple items)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


def _any_string(value: Any, test) -> bool:
    if isinstance(value, str):
        return bool(test(value))
    if isinstance(value, Mapping):
        return any(_any_string(v, test) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_any_string(v, test) for v in value)
    return False


def _special_value(value: Any) -> Any:
    """tokenizer_config stores a token as a string or {"content": ...}; lists of either."""
    if isinstance(value, Mapping) and "content" in value:
        return value["content"]
    if isinstance(value, list):
        return [_special_value(v) for v in value]
    return value


class ChatTemplate:
    """A compiled chat template.

    `special_tokens` (e.g. Tokenizer.special_tokens: bos_token, eos_token, unk_token,
    pad_token, ...) become template variables, as transformers passes its
    `special_tokens_map`. Renders from several threads run one at a time.
    """

    def __init__(self, template: str, special_tokens: Mapping[str, Any] | None = None, *,
                 max_chars: int = MAX_CHARS, max_seconds: float = MAX_SECONDS,
                 max_bytes: int = MAX_BYTES) -> None:
        if not isinstance(template, str) or not template:
            raise TemplateError("chat template is missing or empty")
        self.source = template
        self.special_tokens = {k: _special_value(v) for k, v in (special_tokens or {}).items()}
        self._env = _Sandbox(max_chars, max_seconds)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # the deadline is the environment's
        # Compiling evaluates constant expressions (`'%*s'|format(10**9, 'x')`): bounded too.
        self._env.deadline = time.monotonic() + max_seconds
        try:
            with memory_cap(max_bytes):
                self._template = self._env.from_string(template)
        except TemplateError:
            raise
        except MemoryError:
            raise TemplateError(f"chat template needed more than {max_bytes >> 20} MB of "
                                "memory to compile") from None
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(
                f"chat template syntax error at line {e.lineno}: {_one_line(e.message)}"
            ) from None
        except RecursionError:
            raise TemplateError("chat template is nested too deeply to compile") from None
        except Exception as e:
            raise TemplateError(f"chat template does not compile: {_one_line(e)}") from None
        finally:
            self._env.deadline = math.inf

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None, **extra: Any) -> str:
        """Render messages [{"role": ..., "content": ...}, ...] to the prompt string.

        `extra` are further template variables (e.g. enable_thinking=False); they override
        special tokens of the same name.
        """
        with self._lock:
            return self._render(messages, add_generation_prompt, tools, documents, extra)

    def render_literal(self, messages: Sequence[Mapping[str, Any]], specials: Sequence[str],
                       add_generation_prompt: bool = True,
                       tools: Sequence[Mapping[str, Any]] | None = None,
                       documents: Sequence[Mapping[str, Any]] | None = None,
                       **extra: Any) -> tuple[str, list[tuple[int, int]]]:
        """render(), and the spans [(start, end), ...] of the output where the text of a
        special token (one of `specials`) came from the caller's strings (messages, tools,
        documents, extra) rather than from the template: what the tokenizer must read as
        text. The text is render()'s exactly.

        How: each special token in the caller's strings is replaced by a unique marker
        before rendering and put back after, its span noted."""
        specials, found = self._special_pattern(tuple(specials))
        inputs = (messages, tools, documents, extra)
        try:
            if found is None or not _any_string(inputs, found.search):
                return self.render(messages, add_generation_prompt, tools, documents,
                                   **extra), []
            nonce = secrets.token_hex(8)
            index = {s: i for i, s in enumerate(specials)}

            def mark(text: str) -> str:
                return found.sub(lambda m: f"\ue000{nonce}.{index[m.group(0)]}\ue001", text)

            messages, tools, documents, extra = _map_strings(inputs, mark)
        except RecursionError:
            raise TemplateError("messages are nested too deeply to render") from None
        text = self.render(messages, add_generation_prompt, tools, documents, **extra)
        # the marker as it is, or as JSON with ensure_ascii writes it
        marker = re.compile(rf"\ue000{nonce}\.(\d+)\ue001|\\ue000{nonce}\.(\d+)\\ue001")
        out, spans, last, at = [], [], 0, 0
        for m in marker.finditer(text):
            token = specials[int(m.group(1) or m.group(2))]
            out += [text[last:m.start()], token]
            at += m.start() - last
            spans.append((at, at + len(token)))
            at += len(token)
            last = m.end()
        out.append(text[last:])
        text = "".join(out)
        if nonce in text.lower():
            raise TemplateError("the chat template changed a message's text around a special "
                                "token in a way edgellm cannot follow (parse_special=True "
                                "reads every special token's text as the token)")
        return text, spans

    @functools.lru_cache(maxsize=4)  # noqa: B019 (templates live as long as their model)
    def _special_pattern(self, specials: tuple[str, ...]):
        """specials longest first (leftmost-longest, as the tokenizer matches), and a
        pattern finding any of them (None if there are none)."""
        specials = sorted({s for s in specials if s}, key=len, reverse=True)
        return specials, (re.compile("|".join(re.escape(s) for s in specials))
                          if specials else None)

    def _render(self, messages, add_generation_prompt, tools, documents, extra) -> str:
        env = self._env
        variables = {**self.special_tokens, **extra}
        env.deadline = time.monotonic() + env.max_seconds
        parts: list[str] = []
        size = 0
        try:
            with memory_cap(self.max_bytes):
                for chunk in self._template.generate(
                    messages=messages, tools=tools, documents=documents,
                    add_generation_prompt=add_generation_prompt, **variables,
                ):
                    size += len(chunk)
                    if size > env.max_chars:
                        raise TemplateError(
                            f"chat template output exceeds {env.max_chars} characters")
                    parts.append(chunk)
        except TemplateError:
            raise
        except _Raised as e:
            raise TemplateError(f"chat template raised an error: {_one_line(e)}") from None
        except SecurityError as e:
            raise TemplateError(f"chat template tried something unsafe ({_one_line(e)}): "
                                "refused") from None
        except RecursionError:
            raise TemplateError("chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateError(f"chat template needed more than {self.max_bytes >> 20} MB "
                                "of memory") from None
        except Exception as e:
            raise TemplateError(
                f"chat template failed to render: {type(e).__name__}: {_one_line(e)}"
            ) from None
        finally:
            env.deadline = math.inf
        return "".join(parts)
