"""Generate text from a prompt, streamed to stdout.

Without -m, uses the default model (downloaded and converted on first use).

Context: when the prompt and the answer outgrow the context (--ctx), the context shifts, as
llama.cpp's does: the first 4 tokens stay, the oldest half of the rest is dropped, and
generation goes on. With --no-shift, a prompt that does not fit is an error (exit code 1)
and generation stops when the context is full.
"""

from __future__ import annotations

import sys

from .common import (
    add_model_arguments,
    add_sampling_arguments,
    int_at_least,
    open_model,
    read_stdin_text,
    sampling_kwargs,
    text_argument,
)


def add_arguments(p) -> None:
    add_model_arguments(p)
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
    p.add_argument("--no-shift", action="store_true",
                   help="stop at the end of the context instead of shifting it")
    p.add_argument("--verbose", action="store_true", help="print statistics to stderr")


def run(args) -> int:
    prompt = read_stdin_text() if args.prompt == "-" else args.prompt
    with open_model(args) as llm:
        if args.chat:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            prompt = messages + [{"role": "user", "content": prompt}]
        last = None
        for chunk in llm.stream(prompt, max_tokens=args.max_tokens, stop=args.stop,
                                shift=not args.no_shift, **sampling_kwargs(args)):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
        sys.stdout.write("\n")
        if args.verbose and last is not None and last.stats is not None:
            print(f"[{last.finish_reason}] {last.stats.line()}", file=sys.stderr)
    return 0
