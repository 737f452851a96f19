"""Debian packages a test needs and a fresh CI machine lacks (chromium, sox): installed with
apt-get where the suite runs as root with it, so that the README's test command runs those
tests there too; EDGELLM_NO_APT=1 turns that off. Elsewhere the tests skip saying why."""

from __future__ import annotations

import os
import shutil
import subprocess


def _apt(*args: str) -> str:
    """apt-get ARGS, non-interactive: '' on success, else its last line of errors."""
    cmd = ["apt-get", *args]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)}: timed out"
    if done.returncode == 0:
        return ""
    return f"{' '.join(cmd)}: " + (done.stderr.strip().splitlines() or
                                   [f"exit {done.returncode}"])[-1]


def install(package: str) -> str:
    """Install Debian's `package` with apt-get: '' where apt-get succeeded, else why not
    (one line)."""
    if os.environ.get("EDGELLM_NO_APT"):
        return "EDGELLM_NO_APT is set"
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root with apt-get"
    args = ("install", "-y", "-q", "--no-install-recommends", package)
    why = _apt(*args)
    if why:  # the package lists may be missing or stale on a fresh machine
        why = _apt("update", "-q") or _apt(*args)
    return why
