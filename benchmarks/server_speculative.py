"""`edgellm serve --parallel 4 --draft lookup` against the same server without --draft on
an extraction workload: 4 clients at once, each asking for the fields of its own
~350-450-token document (a supplier review, an invoice twice, an incident report) as JSON
or copied out line by line; aggregate decode tokens/s and each request's time,
alternating the two servers (a fresh server each run, the order flipped each round), the
answers checked identical.

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

# each client its own document and fields, the document first and the ask after it (the
# 135M model asked first, the document after, answered with a run of digits or the
# document's first lines repeated: its guesses were taken, but from loops, not copying)
INVOICE = ("Invoice number INV-2025-0117, issued on 21 January 2025 by Harbour Lights "
  "Engineering Ltd., Unit 4, Quayside Business Park, Leith, Edinburgh EH6 6QW, VAT number "
  "GB 284 1132 07, to Contoso Retail plc, 88 Wellington Street, Leeds LS1 4DL, attention of "
  "Mr. Daniel Okafor, accounts payable. Purchase order: PO-77813. Items: 12 stainless steel "
  "mounting brackets (part HB-220) at 4.50 each, 54.00; 3 boxes of M8 hex bolts (part "
  "HB-M8-100) at 11.20 each, 33.60; 2 replacement hinge assemblies (part HB-H7) at 38.75 "
  "each, 77.50; on-site fitting, 3.5 hours at 42.00 an hour, 147.00; delivery by courier, "
  "15.00. Subtotal 327.10 GBP, VAT at 20 percent 65.42 GBP, total due 392.52 GBP. Payment "
  "terms: 30 days from the invoice date, due by 20 February 2025, by bank transfer to "
  "account 41023388, sort code 80-22-60, quoting the invoice number. Late payments carry "
  "interest at 8 percent above the Bank of England base rate. Questions about this invoice: "
  "Fiona Baird, credit control, fiona.baird@harbourlights.co.uk, telephone 0131 555 0192.")
INCIDENT = ("Incident report IR-3391, filed on 9 December 2024 at 16:40 by Tomasz Nowak, "
  "shift supervisor, Riverside distribution centre, 2 Wharf Lane, Bristol BS1 6QA. At 14:15 "
  "a forklift truck (fleet number FL-07, driven by Amara Singh) struck a pallet rack in aisle "
  "12 while reversing. Two pallets of bottled water fell from the third level of the rack; "
  "nobody was injured. The aisle was closed from 14:20 to 15:55. Damage: one upright of rack "
  "12-C bent, about 140 bottles broken, and a dented rear guard on the forklift. Estimated "
  "cost: 2,300 GBP for the rack repair and 310 GBP of stock written off. Cause found by the "
  "investigation: the reversing camera of FL-07 had failed on 6 December and had not been "
  "reported. Actions: the rack upright was replaced on 10 December by Stanley Racking "
  "Services; FL-07 was taken out of service until its camera was repaired on 11 December; all "
  "drivers will check their cameras at the start of each shift from 16 December; and a "
  "refresher course on reversing was booked for 8 January 2025. Report reviewed by Helen "
  "Marsh, site health and safety manager, on 12 December 2024. Status: closed.")
ASKS = [
    DOCUMENT + "\n\nExtract these fields from the document above as JSON: supplier, address, "
    "contact, phone, email, account_number, contract_start, renewal_date, total_spend, "
    "payment_terms, risk_rating, next_review.",
    INVOICE + "\n\nExtract these fields from the invoice above as JSON: invoice_number, date, "
    "seller, seller_address, buyer, buyer_address, purchase_order, items, subtotal, vat, "
    "total_due, due_date, contact_email.",
    INCIDENT + "\n\nFrom the incident report above, list what happened, the damage, the cause "
    "and the actions taken, one per line, copying the report's words.",
    INVOICE + "\n\nFrom the invoice above, list the items with their part numbers and prices, "
    "then the subtotal, the VAT and the total due, one per line, copying the invoice's words.",
]
WARM = ["Name a colour.", "Name a fruit.", "Name a river.", "Name a city."]


def prompts() -> list[str]:
    return list(ASKS)


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
