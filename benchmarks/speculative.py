"""Prompt lookup (or a draft model) against plain decoding on SmolLM2-135M: decode tokens/s
of the same greedy answers (identical, checked), alternating plain and speculative in one
process per thread count (medians of --rounds), with the acceptance rate.

    python benchmarks/speculative.py [--model FILE] [--draft MODEL] [--threads 1 2]
        [--rounds 2] [--max-tokens 160] [--tasks NAME ...] [--json OUT]
        [--llama-cpp BIN_DIR --gguf TARGET.gguf [--gguf-draft DRAFT.gguf]]

--draft MODEL: the target guesses with MODEL (load(model, draft=MODEL)) instead of prompt
lookup: e.g. a q8_0 target and its q4_0 file. --llama-cpp: llama.cpp's own llama-lookup
(or llama-speculative with --gguf-draft) on the same GGUF files and prompts, against its
plain decoding, as a side by side column (llamacpp_spec.py), its answer's first 120
characters compared with edgellm's plain answer (the two runtimes' q8_0 activations round
differently, so near-ties may go another way: `same` says whether they agree).

Tasks: input-grounded (a rename in a 60-line function, JSON fields from a ~400-token
document, a summary that quotes it) and open-ended chat. Decode tok/s is Stats'
(tokens after the first over the time after the first), so the prefill is left out; cpu
is the same tokens over the process's CPU time after the first token (steadier than wall
time on a busy host at 1 thread; at 2 it counts the workers' waits too). The load average
is printed after each thread count's run.

What SmolLM2-135M answers, which sets what lookup can find: asked for the function with the
code after the instruction, it writes unrelated code; with the code first (code_edit) it
copies the function back (without doing the rename) and then repeats its last lines. The
extraction answer copies some values, then repeats one key; the quoting summary copies the
document's first sentences, then repeats a number's digits. Lookup pays on the copies and
the repeats alike: the output is the model's either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

DEFAULT_MODEL = Path.home() / ".cache" / "edgellm" / "models" / "smollm2-135m-instruct.edgellm"


def _function() -> str:
    """A 60-line Python function."""
    lines = ["def summarize_orders(orders, tax_rate, discount_codes):",
             '    """Totals, taxes and discounts of a list of orders."""',
             "    totals = {}", "    taxes = {}", "    discounts = {}", "    count = 0"]
    for i in range(9):
        lines += [f"    for order in orders[{i}::9]:",
                  f"        key = order['customer'] + '-{i}'",
                  "        amount = order['price'] * order['quantity']",
                  "        code = order.get('code')",
                  "        if code in discount_codes:",
                  "            amount -= amount * discount_codes[code]"]
    lines += ["    return totals, taxes, discounts, count"]
    assert len(lines) == 61
    return "\n".join(lines[:60])


DOCUMENT = (
    "Northwind Traders, quarterly supplier review, prepared by the purchasing office on 14 "
    "January 2025. Supplier: Exotic Liquids Ltd., 49 Gilbert St., London EC1 4SD, United "
    "Kingdom. Contact: Charlotte Cooper, purchasing manager, phone (171) 555-2222, email "
    "ccooper@exoticliquids.co.uk. Account number: EL-30481. Contract started on 1 March 2019 "
    "and renews every two years; the next renewal is due on 1 March 2025. Products supplied: "
    "Chai (10 boxes x 20 bags) at 18.00 per unit, Chang (24 bottles of 12 oz) at 19.00 per "
    "unit, and Aniseed Syrup (12 bottles of 550 ml) at 10.00 per unit. Orders this quarter: "
    "42, of which 39 arrived on time and 3 arrived late by two to five days. Returned goods: "
    "one shipment of Chang, 6 bottles, damaged in transit on 2 December 2024, refunded in "
    "full. Total spend this quarter: 18,420.00 GBP, up 6 percent on the previous quarter. "
    "Payment terms: net 30 days; all invoices were paid within terms. Quality audits: the "
    "audit on 5 November 2024 found no major issues and two minor ones (labels printed in "
    "the wrong language on one batch, and a missing certificate of origin), both fixed by "
    "20 November 2024. Risk rating: low. Recommendation of the purchasing office: renew the "
    "contract for two more years, ask for a 3 percent volume discount on Chai, and move the "
    "Chang shipments to the sea freight service to reduce breakage. Next review: April 2025.")

TASKS = {
    "code_edit": ("grounded", "```python\n" + _function() + "\n```\n\nRename the variable "
                  "amount to line_total in this function. Reply with the complete updated "
                  "function in a code block."),
    "extraction": ("grounded", DOCUMENT + "\n\nExtract these fields as JSON: supplier, "
                   "address, contact, phone, email, account_number, contract_start, "
                   "renewal_date, products, total_spend, risk_rating, next_review."),
    "quoting_summary": ("grounded", DOCUMENT + "\n\nSummarize this review in five bullet "
                        "points, each quoting the document's own words."),
    "chat": ("open", "Tell me a story about a lighthouse keeper who finds a message in a "
             "bottle."),
    "chat_advice": ("open", "What should I think about when choosing my first programming "
                    "language?"),
}


def child(args) -> dict:
    import edgellm

    plain = edgellm.load(args.model, threads=args.threads)
    spec = edgellm.load(args.model, threads=args.threads, draft=args.draft or "lookup")
    out = {}
    for name in args.tasks:
        kind, text = TASKS[name]
        msgs = [{"role": "user", "content": text}]
        for llm in (plain, spec):  # warm: compiled kernels, the tuner's first timings
            llm.generate(msgs, max_tokens=8, temperature=0)
        runs = {"plain": [], "lookup": []}
        cpu = {"plain": [], "lookup": []}
        tokens, acc, texts = {}, [], {}
        for _ in range(args.rounds):
            for label, llm in (("plain", plain), ("lookup", spec)):
                chunks = []
                with llm.stream(msgs, max_tokens=args.max_tokens, temperature=0) as stream:
                    for c in stream:
                        if not chunks:
                            c0 = time.process_time()
                        chunks.append(c)
                cpu[label].append((len(chunks) - 1) / max(time.process_time() - c0, 1e-9))
                st = chunks[-1].stats
                runs[label].append(st.decode_tok_s)
                tokens[label] = [c.token for c in chunks]
                texts[label] = "".join(c.text for c in chunks)
                if label == "lookup":
                    acc.append((st.proposed_tokens, st.accepted_tokens))
        p, a = sum(x for x, _ in acc), sum(y for _, y in acc)
        med = {k: statistics.median(v) for k, v in runs.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        out[name] = {"kind": kind, "plain_tok_s": med["plain"], "lookup_tok_s": med["lookup"],
                     "speedup": med["lookup"] / med["plain"],
                     "cpu_speedup": cmed["lookup"] / cmed["plain"], "proposed": p, "accepted": a,
                     "acceptance": a / p if p else 0.0, "tokens": len(tokens["plain"]),
                     "identical": tokens["plain"] == tokens["lookup"], "text": texts["plain"],
                     "prompt": plain.apply_chat_template(msgs)}
    return out


def llama_cpp(args, results: dict) -> dict:
    """llama.cpp's columns: per thread count and task, its plain and speculative runs
    alternating (medians of --rounds)."""
    import llamacpp_spec

    kind = "draft" if args.gguf_draft else "lookup"
    out = {}
    for t, res in results.items():
        out[t] = {}
        for name, r in res.items():
            runs = {"plain": [], kind: []}
            for _ in range(args.rounds):
                for k in runs:
                    runs[k].append(llamacpp_spec.run(args.llama_cpp, k, args.gguf,
                                                     args.gguf_draft, r["prompt"],
                                                     args.max_tokens, t))
            med = {k: {f: statistics.median(x[f] for x in v) for f in ("tok_s", "cpu_tok_s")}
                   for k, v in runs.items()}
            last = runs[kind][-1]
            out[t][name] = {"plain_tok_s": med["plain"]["tok_s"],
                            "spec_tok_s": med[kind]["tok_s"],
                            "speedup": med[kind]["tok_s"] / med["plain"]["tok_s"],
                            "cpu_speedup": med[kind]["cpu_tok_s"] / med["plain"]["cpu_tok_s"],
                            "proposed": last["proposed"], "accepted": last["accepted"],
                            "acceptance": last["accepted"] / max(last["proposed"], 1),
                            "same": _same(runs["plain"][-1]["text"], r["text"]),
                            "identical": runs["plain"][-1]["text"] == last["text"]}
    return out


def _same(a: str, b: str, n: int = 120) -> bool:
    """Whether two answers agree on their first n characters (or the shorter one)."""
    a, b = a.strip(), b.strip()
    m = min(n, len(a), len(b))
    return a[:m] == b[:m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--draft", default=None, help="a draft model file (default: lookup)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--llama-cpp", default=None, metavar="BIN_DIR",
                    help="llama.cpp's build/bin with llama-lookup and llama-speculative")
    ap.add_argument("--gguf", default=None, help="the target as GGUF (for --llama-cpp)")
    ap.add_argument("--gguf-draft", default=None, help="the draft as GGUF (for --llama-cpp)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = args.threads[0]
        print(json.dumps(child(args)))
        return
    if args.llama_cpp and not args.gguf:
        ap.error("--llama-cpp needs --gguf (the target's GGUF file)")
    results, loads = {}, {}
    for t in args.threads:
        cmd = [sys.executable, __file__, "--child", "--model", args.model, "--threads", str(t),
               "--rounds", str(args.rounds), "--max-tokens", str(args.max_tokens),
               "--tasks", *args.tasks] + (["--draft", args.draft] if args.draft else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[t] = json.loads(proc.stdout.strip().splitlines()[-1])
        with open("/proc/loadavg") as f:
            loads[t] = f.read().split()[0]
    label = "draft" if args.draft else "lookup"
    print(f"{'task':16} {'threads':>7} {'plain':>8} {label:>8} {'x':>6} {'x cpu':>6} "
          f"{'accept':>7} {'prop/acc':>9} {'tokens':>6} same  load")
    for t, res in results.items():
        for name, r in res.items():
            print(f"{name:16} {t:>7} {r['plain_tok_s']:8.1f} {r['lookup_tok_s']:8.1f} "
                  f"{r['speedup']:6.2f} {r['cpu_speedup']:6.2f} {r['acceptance']:7.2f} "
                  f"{r['proposed']:>4}/{r['accepted']:<4} {r['tokens']:6} "
                  f"{r['identical']!s:5} {loads[t]}")
    llama = {}
    if args.llama_cpp:
        llama = llama_cpp(args, results)
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print(f"\nllama.cpp ({'llama-speculative' if args.gguf_draft else 'llama-lookup'} "
              f"against its plain decoding; same: its plain answer begins as edgellm's)")
        print(f"{'task':16} {'threads':>7} {'plain':>8} {'spec':>8} {'x':>6} {'x cpu':>6} "
              f"{'accept':>7} {'prop/acc':>9} same  load")
        for t, res in llama.items():
            for name, r in res.items():
                print(f"{name:16} {t:>7} {r['plain_tok_s']:8.1f} {r['spec_tok_s']:8.1f} "
                      f"{r['speedup']:6.2f} {r['cpu_speedup']:6.2f} {r['acceptance']:7.2f} "
                      f"{r['proposed']:>4}/{r['accepted']:<4} {r['same']!s:5} {load}")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": loads, "results": results,
                                               "llama_cpp": llama}, indent=1))


if __name__ == "__main__":
    main()
