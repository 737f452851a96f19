"""`edgellm` command line: one subcommand per module in edgellm/commands/.

Exit codes: 0 success, 1 runtime error (one line on stderr), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from .errors import EdgeLLMError

COMMANDS = ("generate", "chat", "info", "list", "pull", "bench", "perplexity")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgellm",
                                 description="Quantized on-device LLM inference.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError:
            continue  # a command whose module is not installed
        p = sub.add_parser(name, help=mod.__doc__.splitlines()[0],
                           description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(run=mod.run)
    return ap


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("\nedgellm: interrupted", file=sys.stderr)
        return 130
    except EdgeLLMError as e:
        print(f"edgellm: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 1
