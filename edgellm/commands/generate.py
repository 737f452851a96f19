"""Generate text from a prompt, streamed to stdout.

Without -m, uses the default model (downloaded and converted on first use).

Context: when the prompt and the answer outgrow the context (--ctx), the context shifts, as
llama.cpp's does: the first 4 tokens stay, the oldest half of the rest is dropped, and
generation goes on. With --no-shift, a prompt that does not fit is an error (exit code 1)
and generation stops when the context is full.

Constraints: --json (any JSON object), --json-schema FILE, --regex RE or --grammar FILE
(Lark, or llama.cpp's GBNF) make the output follow them, token by token.
"""

from __future__ import annotations

import sys

from ..errors import EdgeLLMError
from .common import (
    add_draft_argument,
    add_lora_argument,
    add_model_arguments,
    add_sampling_arguments,
    finish_first_run,
    int_at_least,
    open_model,
    read_stdin_text,
    sampling_kwargs,
    text_argument,
)


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_lora_argument(p)
    add_draft_argument(p)
    p.add_argument("-p", "--prompt", required=True, type=text_argument("the prompt"),
                   help="the prompt; '-' reads stdin (UTF-8; invalid UTF-8 is refused)")
    p.add_argument("-n", "--max-tokens", type=int_at_least(0), default=None,
                   help="tokens to generate at most (default: 256)")
    add_sampling_arguments(p)
    p.add_argument("--stop", nargs="+", default=[], metavar="STR",
                   type=text_argument("a stop string", empty=False),
                   help="stop when the output reaches one of these strings")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message with the chat template")
    p.add_argument("--system", default=None, type=text_argument("the system message"),
                   help="system message (with --chat)")
    p.add_argument("--parse-special", action="store_true",
                   help="with --chat: read special-token text in the prompt and system "
                        "message (<|im_start|>...) as the tokens, not as text")
    p.add_argument("--no-shift", action="store_true",
                   help="stop at the end of the context instead of shifting it")
    p.add_argument("--verbose", action="store_true", help="print statistics to stderr")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="output one JSON object")
    shape.add_argument("--json-schema", metavar="FILE", help="output JSON valid against the "
                       "JSON Schema in FILE")
    shape.add_argument("--regex", metavar="RE", help="output a match of the regular expression")
    shape.add_argument("--grammar", metavar="FILE", help="output a sentence of the Lark or "
                       "GBNF grammar in FILE")


def constraint_kwargs(args) -> dict:
    """The constraint the flags ask for, as LLM.stream keywords (files read here)."""
    from ..errors import ConstraintError

    def read(path: str, what: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConstraintError(f"{what} {path}: {getattr(e, 'strerror', None) or e}") \
                from None

    if args.json:
        return {"response_format": {"type": "json_object"}}
    if args.json_schema:
        return {"json_schema": read(args.json_schema, "--json-schema")}
    if args.regex is not None:
        return {"regex": args.regex}
    if args.grammar:
        return {"grammar": read(args.grammar, "--grammar")}
    return {}


def run(args) -> int:
    if args.system is not None and not args.chat:  # it had been dropped without a word
        raise EdgeLLMError("--system is the chat template's system message: it needs --chat")
    if args.parse_special and not args.chat:  # a plain prompt's are tokens already
        raise EdgeLLMError("--parse-special is about chat messages: it needs --chat")
    prompt = read_stdin_text() if args.prompt == "-" else args.prompt
    constraint = constraint_kwargs(args)
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        prompt = messages + [{"role": "user", "content": prompt}]
    # the warmup loads what this prompt runs (a first run compiles that before the answer)
    first = lambda llm: len(llm.encode_prompt(prompt, parse_special=args.parse_special))  # noqa: E731
    with open_model(args, defer_variants=True, first_tokens=first) as llm:
        last = None
        for chunk in llm.stream(prompt, parse_special=args.parse_special,
                                max_tokens=args.max_tokens, stop=args.stop,
                                shift=not args.no_shift, **constraint,
                                **sampling_kwargs(args)):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
        sys.stdout.write("\n")
        if args.verbose and last is not None and last.stats is not None:
            print(f"[{last.finish_reason}] {last.stats.line()}", file=sys.stderr)
        finish_first_run(llm)  # the first run's other variants, after the answer
    return 0
