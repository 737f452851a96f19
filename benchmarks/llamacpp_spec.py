"""llama.cpp's own speculative decoding on the same GGUF files, for speculative.py's side by
side column: `llama-speculative` (a draft model) and `llama-lookup` (prompt lookup), each
against `llama-lookup --spec-draft-n-max 0` (the same loop guessing nothing: plain decoding),
greedy, on the prompt edgellm's chat template renders.

Each run reports llama.cpp's own printed decode tokens/s (wall time) and acceptance
(n_accept / n_drafted), and decode tokens over CPU time: the run's CPU (the child's
rusage) less that of the same command with -n 1 (loading and the prompt), which a busy
host distorts less than wall time at 1 thread. The binaries come from the llama.cpp
sources vendored in llama-cpp-python (`cmake --build build --target llama-lookup
llama-speculative`).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


def _cpu_run(cmd: list[str]) -> tuple[str, str, float]:
    """stdout, stderr and the CPU seconds (user + sys) of one child (RUSAGE_CHILDREN
    before and after it: the child's own; children run one at a time)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {last}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.stdout, proc.stderr, cpu


def _field(err: str, name: str) -> float:
    m = re.search(rf"{name}\s*=\s*([0-9.]+)", err)
    return float(m.group(1)) if m else 0.0


def run(bin_dir: str, kind: str, gguf: str, draft_gguf: str | None, prompt: str, n: int,
        threads: int) -> dict:
    """One greedy run: kind "plain", "lookup" or "draft" (llama-speculative with
    draft_gguf). Returns tok_s (llama.cpp's printed decode speed), cpu_tok_s, proposed,
    accepted, tokens and text (the answer after the prompt)."""
    exe = Path(bin_dir) / ("llama-speculative" if kind == "draft" else "llama-lookup")
    cmd = [str(exe), "-m", gguf, "-p", prompt, "--temp", "0", "-t", str(threads),
           "-c", "4096", "--seed", "1"]
    if kind == "draft":
        cmd += ["-md", draft_gguf, "-td", str(threads), "--spec-draft-n-max", "7"]
    elif kind == "plain":
        cmd += ["--spec-draft-n-max", "0"]
    else:
        cmd += ["--spec-draft-n-max", "7"]
    out, err, cpu = _cpu_run(cmd + ["-n", str(n)])
    _, _, cpu1 = _cpu_run(cmd + ["-n", "1"])
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s+([0-9.]+) t/s", err)
    if m is None:
        raise RuntimeError(f"{exe.name}: no decode speed in its output")
    tokens = int(m.group(1))
    text = out.split(prompt, 1)[-1] if prompt in out else out
    return {"tok_s": float(m.group(3)), "cpu_tok_s": (tokens - 1) / max(cpu - cpu1, 1e-9),
            "proposed": int(_field(err, "n_drafted")), "accepted": int(_field(err, "n_accept")),
            "tokens": tokens, "text": text.strip()}
