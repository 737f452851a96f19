"""Where a file edgellm writes goes (convert-model's OUT, `embed -o`, a session, a LoRA
file): each is written to a temporary file beside it and renamed over it (never a
half-written file), and a rename replaces whatever is at the path.

    target(path, error) -> Path
        the path to write: `path` itself, or the file a symlink at `path` names (the link
        stays; a rename onto the link would have replaced it and left its file as it was).
        `error(message)` is raised for an existing path that is not a regular file (a
        device such as /dev/null, a FIFO, a socket, a directory), which the rename would
        replace: as root, `-o /dev/null` would have made the device a regular file.

    with replacing(path, error) as tmp: ...write tmp...
        the temporary file beside `path`, renamed over it when the block ends; on any
        failure it is removed, and an OSError becomes error("PATH: cannot write: ...").
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def target(path: str | os.PathLike, error: type[Exception]) -> Path:
    """See the module docstring."""
    out = Path(path)
    if out.is_symlink():
        out = Path(os.path.realpath(out))
    try:
        mode = out.stat().st_mode
    except OSError:  # not there yet (or unreadable: the write says why)
        return out
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise error(f"{path}: is {kind}, not a regular file: writing it would replace it "
                    "(give a file's path)")
    return out


@contextlib.contextmanager
def replacing(path: Path, error: type[Exception]):
    """See the module docstring."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise error(f"{path}: cannot write: {e.strerror or e}") from None
        raise
