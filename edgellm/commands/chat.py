"""Chat with a model in the terminal; the KV cache is kept across turns.

In a terminal, Ctrl-C stops the answer being written (not the program); Ctrl-D or /exit
leaves; /reset starts over; /help lists the commands. With stdin not a terminal, or on
SIGTERM, an interrupt ends the program (exit code 130). A model's reasoning (<think>...</think>)
is shown dimmed on a terminal, or not at all with --hide-reasoning. --session FILE resumes
the conversation saved in FILE (if it exists) and saves it there when the chat ends.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ..errors import INTERRUPTS, ArgumentError
from .common import (
    add_draft_argument,
    add_lora_argument,
    add_model_arguments,
    add_sampling_arguments,
    int_at_least,
    open_model,
    sampling_kwargs,
    text_argument,
)

HELP = "commands: /reset (forget the conversation), /exit (or Ctrl-D), /help"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_lora_argument(p)
    add_draft_argument(p)
    p.add_argument("--system", default=None, type=text_argument("the system message"),
                   help="system message")
    p.add_argument("-n", "--max-tokens", type=int_at_least(0), default=None,
                   help="tokens per answer at most (default: 256)")
    add_sampling_arguments(p)
    p.add_argument("--verbose", action="store_true", help="print statistics after answers")
    p.add_argument("--hide-reasoning", action="store_true",
                   help="do not show the model's reasoning (<think> blocks)")
    p.add_argument("--parse-special", action="store_true",
                   help="read special-token text you type (<|im_start|>...) as the tokens, "
                        "not as text")
    p.add_argument("--session", default=None, metavar="FILE",
                   help="resume the conversation saved in FILE, and save it there on exit")


def run(args) -> int:
    if args.session:
        _check_writable(args.session)
    with open_model(args) as llm:
        session = _open_session(llm, args)
        interactive = sys.stdin.isatty()
        if interactive:
            print(f"chatting with {llm.packed.path.name}. {HELP}", file=sys.stderr)
        try:
            _loop(session, args, interactive)
        finally:
            if args.session:
                session.save(args.session)
    return 0


def _check_writable(path: str) -> None:
    """--session FILE is written when the chat ends: a path it cannot be written to (a
    missing directory, a read-only one, a device) is refused before the chat starts, not
    after the conversation is over."""
    import tempfile

    from ..errors import EdgeLLMError
    from ..runtime.output_file import target

    folder = target(path, EdgeLLMError).parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise EdgeLLMError(f"{path}: the session could not be saved there: "
                           f"{e.strerror or e}") from None


def _open_session(llm, args):
    """A new chat, or the one saved in --session FILE (its own system message)."""
    from ..chat import ChatSession

    if args.session and Path(args.session).exists():
        chat = ChatSession.load(llm, args.session, parse_special=args.parse_special)
        print(f"(resumed {args.session}: {len(chat.messages)} messages, "
              f"{len(llm.model.tokens)} tokens)", file=sys.stderr)
        if args.system is not None and args.system != chat.system:
            print("edgellm: warning: --system is not used: the resumed conversation keeps "
                  "its own system message", file=sys.stderr)
        return chat
    return llm.chat(system=args.system, parse_special=args.parse_special)


def _loop(session, args, interactive: bool) -> None:
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        except UnicodeDecodeError as e:  # stdin's encoding is strict
            raise ArgumentError(f"stdin is not valid {e.encoding}: byte "
                                f"0x{e.object[e.start]:02x}") from None
        except KeyboardInterrupt:
            if not _stops_answer_only(interactive):
                raise
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
        try:
            _answer(session, text, args, interactive)
        except ArgumentError as e:  # at a terminal, one bad line does not end the chat
            if not interactive:
                raise
            print(f"edgellm: error: {e}", file=sys.stderr)


def _stops_answer_only(interactive: bool) -> bool:
    """Whether the interrupt being handled only stops the answer: a Ctrl-C (SIGINT) typed
    at a terminal. SIGTERM, or any interrupt of a piped session, ends the program."""
    return interactive and (not INTERRUPTS or INTERRUPTS[-1] == signal.SIGINT)


DIM, RESET = "\033[2m", "\033[0m"


def _show(pieces, args) -> None:
    """Write (kind, text) pieces: reasoning dimmed on a terminal, or hidden."""
    dim = sys.stdout.isatty()
    for kind, text in pieces:
        if kind == "reasoning":
            if args.hide_reasoning:
                continue
            text = f"{DIM}{text}{RESET}" if dim else text
        sys.stdout.write(text)
    sys.stdout.flush()


def _answer(session, text: str, args, interactive: bool) -> None:
    from ..text.reasoning import ReasoningSplitter, supports_thinking

    last = None
    split = ReasoningSplitter() if supports_thinking(session.llm.packed.chat_template) else None
    try:
        for chunk in session.send(text, max_tokens=args.max_tokens, **sampling_kwargs(args)):
            _show(split.feed(chunk.text) if split else [("content", chunk.text)], args)
            last = chunk
        if split:
            _show(split.flush(), args)
    except KeyboardInterrupt:
        if not _stops_answer_only(interactive):
            raise
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.verbose and last is not None and last.stats is not None:
        print(f"[{last.finish_reason}] prefilled {session.last_prefill_tokens} new tokens; "
              f"{last.stats.line()}", file=sys.stderr)
