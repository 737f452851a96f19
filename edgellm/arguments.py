"""Checks of the public API's arguments: a bad type or value raises ArgumentError (an
EdgeLLMError, also a TypeError and a ValueError) naming the keyword, before anything runs.

Decisions (README "Bad input"): text must be valid Unicode (a str with lone surrogates,
as undecodable bytes become under surrogateescape, is refused, not replaced); bytes are
refused where text or token ids are expected (decode them first); token ids are ints
(numpy integer arrays too), never floats or bools; a stop string may not be empty.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ArgumentError


def _kind(value: Any) -> str:
    return type(value).__name__


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{name} must be True or False, got {_kind(value)} {value!r:.60}")
    return bool(value)


def integer(value: Any, name: str, lo: int, hi: int | None = None,
            none: bool = False) -> int | None:
    """An int in [lo, hi] (None allowed if `none`)."""
    if value is None and none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{name} must be an int, got {_kind(value)} {value!r:.60}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ArgumentError(f"{name} must be {bound}, got {value}")
    return value


def choice(value: Any, name: str, options) -> str:
    """One of `options` (strs)."""
    if not isinstance(value, str) or value not in options:
        raise ArgumentError(f"{name} must be one of {', '.join(options)}, got "
                            f"{_kind(value)} {value!r:.60}")
    return value


def text(value: Any, name: str, error: type[Exception] = ArgumentError) -> str:
    """A str that encodes to UTF-8 (no lone surrogates); `error` (ArgumentError, or the
    caller's own kind: constraints raise ConstraintError) otherwise."""
    if not isinstance(value, str):
        raise error(f"{name} must be a str, got {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise error(f"{name} is not valid Unicode: {e.reason} at character "
                            f"{e.start} ({value[e.start]!r}); undecodable bytes must be "
                            "decoded or replaced before they reach edgellm") from None
    return value


def stops(value: Any) -> list[str]:
    """stop=: None, a str, or a sequence of non-empty strs."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, (bytes, bytearray)) or not isinstance(value, (Sequence, set,
                                                                          frozenset)):
        raise ArgumentError(f"stop must be a str or a list of str, got {_kind(value)}")
    out = []
    for s in value:
        text(s, "stop")
        if not s:
            raise ArgumentError("stop strings must not be empty (an empty string would stop "
                                "before the first token)")
        out.append(s)
    return out


def token_ids(value: Any, vocab_size: int, name: str = "token ids") -> list[int]:
    """A 1-D sequence of ints in [0, vocab_size) -> list[int]."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not (np.issubdtype(value.dtype, np.integer) or value.size == 0):
            raise ArgumentError(f"{name} must be a 1-D array of integers, got "
                                f"{value.ndim}-D {value.dtype}")
        items = value.tolist()
    elif isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise ArgumentError(f"{name} must be a list of ints, got {_kind(value)}")
    else:
        items = list(value)
    out = []
    for t in items:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise ArgumentError(f"{name} must be ints, got {_kind(t)} {t!r:.40}")
        t = int(t)
        if not 0 <= t < vocab_size:
            raise ArgumentError(f"token id {t} is outside the vocabulary (0..{vocab_size - 1})")
        out.append(t)
    return out


def file_path(value: Any, name: str = "path") -> Path:
    """A file's path (load's, a session's): a non-empty str, bytes or os.PathLike."""
    if isinstance(value, (bytes, bytearray)):
        value = os.fsdecode(bytes(value))
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentError(f"{name} must be a str or os.PathLike, got {_kind(value)}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path:
        raise ArgumentError(f"{name} is empty")
    if "\0" in path:
        raise ArgumentError(f"{name} contains a NUL character")
    try:
        path.encode(errors="surrogateescape")
    except UnicodeEncodeError:
        raise ArgumentError(f"{name} {path!r:.80} is not valid Unicode") from None
    return Path(path)
