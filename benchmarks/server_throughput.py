"""Aggregate decode tokens/s of `edgellm serve` and llama.cpp's `llama-server`, with 1 and
4 concurrent streams, through the openai client; runs alternating.

    python benchmarks/server_throughput.py --model EDGELLM_FILE --gguf GGUF_FILE
        [--llama-server PATH] [--threads 2] [--streams 1 4] [--tokens 96] [--rounds 3]
        [--variants "" "--act-type int8" ...] [--json OUT]

Each round starts each server (edgellm with --parallel = the most streams asked for,
llama-server with --parallel the same and --ctx-size room for every slot), warms it with
one request and then one on every slot at once (a fresh server's first batch pays for its
first touches: edgellm's first 4-stream run read 293 tok/s, the next ones 334-359; the
warm prompts are not the measured ones, whose prefill is then not cached), then for each
stream count runs that many streams at once, each asking for --tokens tokens (ignore_eos,
which both servers take, so that no stream ends early whatever the activations' rounding
picks; temperature 0; the prompts differ per stream and per run: with the one-stream
run's prompt among the four streams', that stream's cached prompt had started it ~80 ms
before the others, whose last steps then ran without it). Aggregate decode tok/s = tokens
streamed after each stream's first (as the server's usage counts them) / (time from the
first stream's first token to the last stream's end); "while all decode": the content
chunks between the last stream's first token and the first stream's last, over that time
(no stream prefilling or done: streams whose prompts were cached start before the others'
prefill, and end before them); TTFT =
median time to the first content chunk. Medians over rounds, and the
ratios asked for by issue 24: edgellm 4-stream / edgellm 1-stream, edgellm 4-stream /
llama-server 4-stream, for each of --variants (extra `edgellm serve` arguments, one string a
variant: "--act-type int8 --kv-type f16" is llama.cpp's own precision, int8 activations and
an f16 KV cache). The load average at start and end is printed with them, and the CPU time
per streamed token of the server process and of this one (the openai client), from /proc:
on two cores every other thread's CPU preempts a step's workers (a worker waits for its
preempted partner at the next barrier), so the client's share slows both servers' steps.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_SERVER = ("/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/"
                "llama-server")
PROMPTS = ["Tell me a long story about a lighthouse keeper.",
           "Explain how a bicycle works, in detail.",
           "Describe a walk through a forest in autumn.",
           "Write a letter to a friend about a trip to the sea.",
           "Tell me a long story about a clockmaker's apprentice.",
           "Explain how a steam engine works, in detail.",
           "Describe a night in a busy harbour town.",
           "Write a letter to a friend about learning to sail."]
WARM = ["Name a colour.", "Name a fruit.", "Name a river.", "Name a city."]


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} did not become healthy")


def start(kind: str, args, parallel: int) -> tuple[subprocess.Popen, str]:
    port = _port()
    if kind.startswith("edgellm"):
        cmd = [sys.executable, "-m", "edgellm", "serve", "-m", args.model, "--port", str(port),
               "--parallel", str(parallel), "-t", str(args.threads), "--ctx", "1024",
               *kind.split()[1:]]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
    else:
        cmd = [args.llama_server, "-m", args.gguf, "--port", str(port), "--parallel",
               str(parallel), "-t", str(args.threads), "-tb", str(args.threads),
               "--ctx-size", str(1024 * parallel), "--log-disable"]
        env = dict(os.environ)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc)
    return proc, url


def stream_once(client, model: str, prompt: str, tokens: int, extra: dict) -> dict:
    t0 = time.perf_counter()
    times = []  # of the content chunks
    n = 0
    for ch in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
            temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body=extra):
        if ch.usage is not None:
            n = ch.usage.completion_tokens
        if ch.choices and ch.choices[0].delta.content:
            times.append(time.perf_counter())
    return {"start": t0, "first": times[0], "last": times[-1], "times": times, "tokens": n}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (None without /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, model: str, streams: int, tokens: int, extra: dict,
            prompts: list[str] = PROMPTS, pid: int | None = None) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    out: list = [None] * streams

    def one(i):
        out[i] = stream_once(client, model, prompts[i % len(prompts)], tokens, extra)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    server0, client0 = cpu_seconds(pid) if pid else None, os.times()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server1, client1 = cpu_seconds(pid) if pid else None, os.times()
    streamed = sum(r["tokens"] for r in out)
    server_ms = None if server0 is None or server1 is None else \
        1000 * (server1 - server0) / streamed
    client_ms = 1000 * (client1.user + client1.system - client0.user - client0.system) / streamed
    begin = min(r["first"] for r in out)
    end = max(r["last"] for r in out)
    decoded = sum(r["tokens"] - 1 for r in out)  # the first of each came from its prefill
    lo, hi = max(r["first"] for r in out), min(r["last"] for r in out)
    together = sum(sum(1 for t in r["times"] if lo < t <= hi) for r in out)
    return {"tok_s": decoded / (end - begin), "all_tok_s": together / (hi - lo),
            "ttft_s": statistics.median(r["first"] - r["start"] for r in out),
            "tokens": [r["tokens"] for r in out], "server_cpu_ms": server_ms,
            "client_cpu_ms": client_ms}


def _cpu(m: dict) -> str:
    server = "?" if m["server_cpu_ms"] is None else f"{m['server_cpu_ms']:.2f}"
    return f"server {server} ms, client {m['client_cpu_ms']:.2f} ms"


def load() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the edgellm file")
    ap.add_argument("--gguf", required=True, help="the same weights as GGUF (llama-server)")
    ap.add_argument("--llama-server", default=LLAMA_SERVER)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=[""],
                    help='edgellm serve arguments, a string a variant ("": the defaults)')
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ours = [" ".join(["edgellm", *v.split()]) for v in args.variants]
    kinds = ours + (["llama-server"] if os.access(args.llama_server, os.X_OK) else [])
    w = max(len(k) for k in kinds)
    results: dict = {k: {n: [] for n in args.streams} for k in kinds}
    load_start = load()
    parallel = max(args.streams)
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            proc, url = start(kind, args, parallel)
            try:
                model = "x" if kind == "llama-server" else Path(args.model).stem
                extra = {"ignore_eos": True}
                measure(url, model, 1, 8, extra, WARM)  # warm: one stream, then every slot
                measure(url, model, parallel, 8, extra, WARM)
                used = 0  # each run's prompts new to this server (none cached in a slot)
                for n in args.streams:
                    fresh = [PROMPTS[(used + i) % len(PROMPTS)] for i in range(n)]
                    used += n
                    m = measure(url, model, n, args.tokens, extra, fresh, pid=proc.pid)
                    results[kind][n].append(m)
                    print(f"round {r + 1} {kind:{w}s} {n} stream(s): {m['tok_s']:7.1f} tok/s "
                          f"aggregate ({m['all_tok_s']:6.1f} while all decode), TTFT "
                          f"{m['ttft_s'] * 1000:6.0f} ms, CPU a token: {_cpu(m)}, tokens "
                          f"{m['tokens']} (load {load()})", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    def median(v, key):
        values = [m[key] for m in v if m[key] is not None]
        return statistics.median(values) if values else None

    summary = {k: {n: {"tok_s": median(v, "tok_s"), "all_tok_s": median(v, "all_tok_s"),
                       "ttft_ms": 1000 * median(v, "ttft_s"),
                       "server_cpu_ms": median(v, "server_cpu_ms"),
                       "client_cpu_ms": median(v, "client_cpu_ms")}
                   for n, v in per.items()} for k, per in results.items()}
    print(f"\nmedians over {args.rounds} rounds, {args.threads} threads, {args.tokens}-token "
          f"streams; load average at start {load_start}, at end {load()}")
    for kind, per in summary.items():
        for n, s in per.items():
            print(f"  {kind:{w}s} {n} stream(s): {s['tok_s']:7.1f} tok/s ({s['all_tok_s']:6.1f} "
                  f"while all decode), TTFT {s['ttft_ms']:6.0f} ms, CPU a token: {_cpu(s)}")
    lo, hi = min(args.streams), max(args.streams)

    def ratio(a, b):
        return (f"x{a['tok_s'] / b['tok_s']:.2f} (while all decode "
                f"x{a['all_tok_s'] / b['all_tok_s']:.2f})")

    for kind in ours:
        e = summary[kind]
        print(f"  {kind} {hi} streams / {lo}: {ratio(e[hi], e[lo])}")
    if "llama-server" in summary:
        ls = summary["llama-server"]
        print(f"  llama-server {hi} streams / {lo}: {ratio(ls[hi], ls[lo])}")
        for kind in ours:
            print(f"  {kind} / llama-server at {hi} streams: {ratio(summary[kind][hi], ls[hi])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "load_start": load_start,
                                               "load_end": load()}, indent=1))


if __name__ == "__main__":
    main()
