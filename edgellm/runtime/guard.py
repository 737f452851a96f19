"""Native libraries fed untrusted data: a Rust panic becomes a typed, one-line error.

`tokenizers` panics (pyo3's PanicException, a BaseException) on some malformed tokenizer.json
files (an unparsable precompiled charsmap) and on some inputs (a pre-tokenizer regex that
backtracks past onig's retry limit). Rust's panic hook also writes the panic, and with
RUST_BACKTRACE=1 a whole backtrace, to stderr. `native(...)` runs such a call with stderr
set aside: on a panic that output is dropped and the caller's error raised instead; on
anything else it is written out as it came.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import TypeVar

from ..errors import EdgeLLMError, is_panic

T = TypeVar("T")


def native(fn: Callable[..., T], *args, error: Callable[[str], EdgeLLMError], **kwargs) -> T:
    """fn(*args, **kwargs); a panic inside raises error(one-line panic message)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr: nothing to set aside
        saved = None
    if saved is None:
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            if is_panic(e):
                raise error(_one_line(e)) from None
            raise
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        panicked = False
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            if not is_panic(e):
                raise
            panicked = True
            raise error(_one_line(e)) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."
