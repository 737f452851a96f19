"""What the runtime-against-runtime benchmarks share: each timed run is a fresh process
(this script again with --child), so its peak RSS is its own and one runtime's threads or
caches never warm the other's.

    add_child_args(ap, *extra)     the hidden --child TARGET, --label and `extra` options
    run_child(script, label, threads, argv) -> the child's last stdout line, parsed as JSON
    peak_rss_mib()                 this process's peak RSS (ru_maxrss), MiB
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MKL_NUM_THREADS")


def add_child_args(ap: argparse.ArgumentParser, *extra: str) -> None:
    for name in ("--child", "--label", *extra):
        ap.add_argument(name, help=argparse.SUPPRESS)


def run_child(script: str, label: str, threads: int, argv: list[str]) -> dict:
    """Runs `script --label LABEL --threads N argv` with every thread pool capped at N and
    this checkout first on the path; exits with the child's last error lines if it fails."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{k: str(threads) for k in THREAD_VARS})
    cmd = [sys.executable, script, "--label", label, "--threads", str(threads), *argv]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{label} failed: {r.stderr.strip().splitlines()[-3:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
