"""Time to first token of 8 clients that send `edgellm serve` the same ~1,500-token system
prompt with different questions, with the server's prompt cache (--prompt-cache-bytes, its
default) and without it (0).

    python benchmarks/server_prompt_cache.py [--model smollm2-135m-instruct] [--parallel 2]
        [--ctx 4096] [--tokens 8] [--only burst] [--rounds 1] [--threads N] [--code DIR]
        [--json OUT]

Each server is warmed with a short unrelated prompt (its first touches are not counted),
then two patterns run, each on a fresh server: "sequential", each client after the one
before has its answer, and "burst", the first client alone, then the other seven at once
(--parallel slots, the rest queued). TTFT = from sending the request to its first content
chunk (streamed, temperature 0), queueing included. The acceptance (issue 53) is the 8th
client's TTFT at most 0.2x the first's. Without the cache, a sequential client lands on
the slot that served the one before and reuses that slot's own sequence: the shared cache
makes the difference when the clients come together (burst: the other slots never saw
the prompt; the later clients' TTFT counts their wait for a slot, behind the others'
answers). The load average is printed at the start and the end: on a busy
machine every time is longer, the ratios less so. --only burst (or sequential) runs that
pattern with the cache alone, --rounds times (a server each). --code DIR: the source tree
whose edgellm the servers run (default this one: an A/B alternates two trees with one
script); --threads N: the servers' threads (1 on a busy machine: a thread team that
shares the cores with other processes waits for its members at every parallel region).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = " ".join(f"Rule {i}: answer politely and cite the handbook section {i}."
                  for i in range(92))
MODEL_ID: dict[str, str] = {}  # a server's url -> the id it serves
QUESTIONS = ["What is 2+2?", "Name a color.", "Where is Paris?", "Who wrote Hamlet?",
             "Name a fruit.", "What is the sun?", "Say hello.", "Count to three."]


def start(model: str, parallel: int, ctx: int, cache: str | None, threads: int | None = None,
          code: Path = ROOT):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    args = [sys.executable, "-m", "edgellm", "serve", "-m", model, "--port", str(port),
            "--parallel", str(parallel), "--ctx", str(ctx)]
    if cache is not None:
        args += ["--prompt-cache-bytes", cache]
    if threads is not None:
        args += ["--threads", str(threads)]
    # run from `code`, with it first on the path: `python -m edgellm` imports that tree's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen(args, cwd=code, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"edgellm serve exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                MODEL_ID[url] = json.load(r)["data"][0]["id"]
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("edgellm serve did not start")


def ttft(url: str, system: str, question: str, tokens: int) -> tuple[float, int]:
    """(seconds to the first content chunk, cached prompt tokens) of one streamed chat."""
    body = {"model": MODEL_ID[url], "stream": True, "max_tokens": tokens, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    first, cached = None, -1
    with urllib.request.urlopen(req, timeout=1800) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get(
                    "content"):
                first = time.monotonic() - t0
    return first if first is not None else time.monotonic() - t0, cached


def run(url: str, pattern: str, tokens: int) -> list[tuple[float, int]]:
    out: list = [None] * len(QUESTIONS)
    out[0] = ttft(url, SYSTEM, QUESTIONS[0], tokens)
    if pattern == "sequential":
        for i, q in enumerate(QUESTIONS[1:], 1):
            out[i] = ttft(url, SYSTEM, q, tokens)
        return out

    def one(i):
        out[i] = ttft(url, SYSTEM, QUESTIONS[i], tokens)

    threads = []
    for i in range(1, len(QUESTIONS)):  # in order: the 8th asks last
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(0.01)
    for t in threads:
        t.join()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--only", choices=("sequential", "burst"), default=None)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--code", type=Path, default=ROOT)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    print(f"load average at start: {os.getloadavg()}; edgellm from {a.code.resolve()}")
    results = {}
    runs = [(name, cache, pattern) for name, cache in (("cache", None), ("no cache", "0"))
            for pattern in ("sequential", "burst")] if a.only is None else \
        [("cache", None, a.only)] * a.rounds
    for name, cache, pattern in runs:
        proc, url = start(a.model, a.parallel, a.ctx, cache, a.threads, a.code.resolve())
        try:
            ttft(url, "You are terse.", "Name a river.", 2)  # warm
            times = run(url, pattern, a.tokens)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        first, last = times[0][0], times[-1][0]
        results.setdefault(f"{name}, {pattern}", []).append(times)
        print(f"{name:8} {pattern:10}: TTFT first {first:6.2f} s, 8th {last:6.2f} s "
              f"({last / first:.2f}x), slowest of 2-8 "
              f"{max(t for t, _ in times[1:]):6.2f} s; cached tokens "
              f"{[c for _, c in times]}; load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
