"""`edgellm` command line: one subcommand per module in edgellm/commands/.

Exit codes: 0 success, 1 runtime error (one line on stderr), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys

from .errors import (
    INTERRUPTS,
    EdgeLLMError,
    Interrupted,
    catch_signals,
    is_panic,
    quiet_stdout,
    restore_signals,
)

COMMANDS = ("generate", "chat", "embed", "classify", "entities", "rerank", "serve", "info",
            "list", "pull", "bench", "perplexity", "transcribe")


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


def _without_scipy() -> None:
    """Keep scipy out of the command's process: numba imports it, when it is installed, only
    to check its version and to probe BLAS for np.dot, which edgellm's kernels do not use;
    it costs 17 MiB of RSS. (Not done for the Python API: a host program may want both.)"""
    if "scipy" not in sys.modules:
        sys.modules["scipy"] = None  # import scipy raises ImportError, which numba expects


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv, as the program); the exit code. As
    the program it exits here, without the interpreter's teardown (see _exit_now)."""
    if argv is not None:
        return _main(argv)
    _without_scipy()
    _exit_now(_main(None))


def _main(argv: list[str] | None) -> int:
    handlers = catch_signals()
    interrupts = len(INTERRUPTS)
    try:
        try:
            args = build_parser().parse_args(argv)
            return int(args.run(args) or 0)
        except Exception:
            if len(INTERRUPTS) > interrupts:  # an interrupt some library turned into an error
                raise Interrupted("signal") from None
            raise
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the exit
        print("\nedgellm: interrupted", file=sys.stderr)
        if argv is None:  # as the program: nothing is left to write, leave at once
            _exit_now(130)
        return 130
    except EdgeLLMError as e:
        error(f"edgellm: error: {e}")
        return 1
    except BrokenPipeError:
        quiet_stdout()
        return 1
    except MemoryError:
        error("edgellm: error: out of memory")
        return 1
    except OSError as e:  # the machine's, not a bug (reads are wrapped where they happen)
        if e.errno in OUTPUT_ERRNOS or e.errno is None:  # numpy: a short write, no errno
            quiet_stdout()
            error(f"edgellm: error: cannot write the output: {e.strerror or e}")
        else:
            error(f"edgellm: error: {e.strerror or e}"
                  + (f": {e.filename}" if e.filename else ""))
        return 1
    except Exception as e:  # a bug: one line for the user, the traceback on request
        if os.environ.get("EDGELLM_DEBUG"):
            raise
        error(f"edgellm: internal error: {type(e).__name__}: {e} (a bug in edgellm, please "
              "report it; EDGELLM_DEBUG=1 shows the traceback)")
        return 1
    except BaseException as e:  # a library's panic (a BaseException): the model's data
        if not is_panic(e) or os.environ.get("EDGELLM_DEBUG"):
            raise
        error(f"edgellm: error: a library failed on the model's data: {str(e)[:200]}")
        return 1
    finally:
        restore_signals(handlers, argv is None)


OUTPUT_ERRNOS = (errno.EPIPE, errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # a failed write


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, which takes up to a second or more once the
    kernels are loaded (numba/LLVM objects): an interrupted command exits within a second,
    and a finished one (every file it wrote is closed by then) as soon as it is done."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def error(message: str) -> None:
    """Print `message` to stderr as one line."""
    print(" ".join(str(message).split()), file=sys.stderr)

