"""Chat with a model in the terminal; the KV cache is kept across turns.

Ctrl-C stops the answer being written (not the program); Ctrl-D or /exit leaves;
/reset starts over; /help lists the commands.
"""

from __future__ import annotations

import sys

from .common import (
    add_model_arguments,
    add_sampling_arguments,
    int_at_least,
    open_model,
    sampling_kwargs,
)

HELP = "commands: /reset (forget the conversation), /exit (or Ctrl-D), /help"


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("-n", "--max-tokens", type=int_at_least(0), default=None,
                   help="tokens per answer at most (default: 256)")
    add_sampling_arguments(p)
    p.add_argument("--verbose", action="store_true", help="print statistics after answers")


def run(args) -> int:
    with open_model(args) as llm:
        session = llm.chat(system=args.system)
        interactive = sys.stdin.isatty()
        if interactive:
            print(f"chatting with {llm.packed.path.name}. {HELP}", file=sys.stderr)
        while True:
            try:
                line = input("> " if interactive else "")
            except EOFError:
                break
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                break
            if text == "/help":
                print(HELP, file=sys.stderr)
                continue
            if text == "/reset":
                session.reset()
                print("(conversation reset)", file=sys.stderr)
                continue
            _answer(session, text, args)
    return 0


def _answer(session, text: str, args) -> None:
    last = None
    try:
        for chunk in session.send(text, max_tokens=args.max_tokens, **sampling_kwargs(args)):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
    except KeyboardInterrupt:
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.verbose and last is not None and last.stats is not None:
        print(f"[{last.finish_reason}] prefilled {session.last_prefill_tokens} new tokens; "
              f"{last.stats.line()}", file=sys.stderr)
