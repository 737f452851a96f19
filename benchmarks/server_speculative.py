"""`edgellm serve --parallel 4 --draft lookup` against the same server without --draft on
an extraction workload: 4 clients at once, each asking for fields of a ~400-token
document; aggregate decode tokens/s and each request's time, alternating the two servers
(a fresh server each run, the order flipped each round), the answers checked identical.

    python benchmarks/server_speculative.py [--model FILE] [--threads 2] [--rounds 3]
        [--max-tokens 200] [--json OUT]

Each prompt is first prefilled alone (a 1-token request) into the server's prompt cache,
from which the measured requests restore it: prompts prefilled together round as their
grouping falls (batch.py), which can flip a near-tie in either server, and the answers
are compared. Aggregate tok/s: tokens after each stream's first / (first stream's first
token to the last stream's end), as server_throughput.py counts them. A request's time:
from its request to its last chunk. The load average at each run and the
server's CPU seconds a token (from /proc) are printed beside the numbers: on a loaded
machine wall time is noisy, so the ratios (lookup / plain, per round and their medians)
are what to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_throughput import cpu_seconds, load, start  # noqa: E402
from speculative import DEFAULT_MODEL, DOCUMENT  # noqa: E402

ASKS = ["Extract these fields from the document below as JSON: supplier, address, contact, "
        "phone, email, account_number.",
        "From the document below, copy out as a list: the products with their prices, the "
        "orders this quarter, the returned goods and the total spend.",
        "Extract these fields from the document below as JSON: contract_start, "
        "renewal_date, payment_terms, risk_rating, recommendation, next_review.",
        "From the document below, copy the sentences about the quality audits and the "
        "returned goods, word for word."]
WARM = ["Name a colour.", "Name a fruit.", "Name a river.", "Name a city."]


def prompts() -> list[str]:
    # the ask first: each client's prompt its own from its first tokens (no prefix that
    # one slot's prefill would hand the others through the prompt cache)
    return [f"{ask}\n\n{DOCUMENT}" for ask in ASKS]


def one(client, model: str, prompt: str, tokens: int) -> dict:
    t0 = time.perf_counter()
    times, text, n = [], [], 0
    for ch in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}):
        if ch.usage is not None:
            n = ch.usage.completion_tokens
        if ch.choices and ch.choices[0].delta.content:
            times.append(time.perf_counter())
            text.append(ch.choices[0].delta.content)
    times = times or [time.perf_counter()]  # (a 1-token answer may have no text)
    return {"start": t0, "first": times[0], "last": times[-1], "tokens": n,
            "text": "".join(text)}


def run(url: str, model: str, asks: list[str], tokens: int, pid: int | None = None) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    out: list = [None] * len(asks)

    def go(i):
        out[i] = one(client, model, asks[i], tokens)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(asks))]
    cpu0 = cpu_seconds(pid) if pid else None
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = cpu_seconds(pid) if pid else None
    decoded = sum(r["tokens"] - 1 for r in out)
    begin, end = min(r["first"] for r in out), max(r["last"] for r in out)
    streamed = sum(r["tokens"] for r in out)
    return {"tok_s": decoded / (end - begin) if end > begin else 0.0,
            "request_s": [r["last"] - r["start"] for r in out],
            "tokens": [r["tokens"] for r in out], "texts": [r["text"] for r in out],
            "cpu_ms": None if cpu0 is None or cpu1 is None else
            1000 * (cpu1 - cpu0) / streamed, "load": load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kinds = {"plain": "edgellm", "lookup": "edgellm --draft lookup"}
    model = Path(args.model).stem
    results: dict = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = list(kinds) if r % 2 == 0 else list(kinds)[::-1]
        for label in order:
            proc, url = start(kinds[label], args, 4)
            try:
                run(url, model, WARM, 8)  # compiled, paged in, every slot's first step
                for ask in prompts():  # each prompt prefilled alone, into the prompt cache
                    run(url, model, [ask], 1)
                time.sleep(0.5)
                m = run(url, model, prompts(), args.max_tokens, pid=proc.pid)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            results[label].append(m)
            cpu = "?" if m["cpu_ms"] is None else f"{m['cpu_ms']:.2f}"
            print(f"round {r + 1} {label:6s}: {m['tok_s']:6.1f} tok/s aggregate, requests "
                  f"{' '.join(f'{s:5.1f}' for s in m['request_s'])} s, server CPU {cpu} ms a "
                  f"token, tokens {m['tokens']} (load {m['load']})", flush=True)
    same = all(a["texts"] == b["texts"] for a, b in zip(results["plain"], results["lookup"]))
    agg = [b["tok_s"] / a["tok_s"] for a, b in zip(results["plain"], results["lookup"])]
    req = [[tb / ta for ta, tb in zip(a["request_s"], b["request_s"])]
           for a, b in zip(results["plain"], results["lookup"])]
    per_request = [statistics.median(r[i] for r in req) for i in range(len(ASKS))]
    cpu = [b["cpu_ms"] / a["cpu_ms"] for a, b in zip(results["plain"], results["lookup"])
           if a["cpu_ms"] and b["cpu_ms"]]
    print(f"\nlookup / plain, {args.threads} threads, {args.rounds} rounds: aggregate tok/s "
          f"x{statistics.median(agg):.2f} (rounds {', '.join(f'{x:.2f}' for x in agg)}); "
          f"request time x{', x'.join(f'{x:.2f}' for x in per_request)} (medians a request; "
          f"< 1 is faster); server CPU a token "
          f"{f'x{statistics.median(cpu):.2f}' if cpu else '?'}")
    print(f"answers identical: {same}; load average now {load()}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "results": results, "aggregate_ratio": agg, "request_ratio": req,
            "cpu_ratio": cpu, "identical": same}, indent=1))


if __name__ == "__main__":
    main()
