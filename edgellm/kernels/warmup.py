"""Tell the user when kernels are being compiled (the first run with a given kernel build)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

import numba

from ..numba_setup import CACHE_DIR
from .jit import CACHE_TAG


def _marker() -> Path:
    src = Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(src.glob("*.py")):
        h.update(f.read_bytes())
    return Path(CACHE_DIR) / f"edgellm-warm-{CACHE_TAG}-{numba.__version__}-{h.hexdigest()[:10]}"


@contextlib.contextmanager
def compile_notice(say):
    """Around the first model run: says 'compiling' when the kernel cache is cold, and how
    long it took; silent on a warm start."""
    marker = _marker()
    cold = not marker.exists()
    if cold:
        say("edgellm: compiling kernels for this machine (first run only, about a minute)...")
    t0 = time.perf_counter()
    yield
    if cold:
        say(f"edgellm: kernels compiled in {time.perf_counter() - t0:.1f} s and cached in "
            f"{CACHE_DIR}")
        with contextlib.suppress(OSError):
            os.makedirs(marker.parent, exist_ok=True)
            marker.touch()
