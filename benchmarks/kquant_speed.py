"""K-quant files: edgellm against llama.cpp's own `llama-bench`, same file, runs alternating.

    python benchmarks/kquant_speed.py --pair EDGELLM_FILE GGUF_FILE [--pair ...]
        --llama-bench PATH/llama-bench [--threads 1 2] [--rounds 3] [-p 128] [-n 32]
        [--json OUT]

Each round runs, per pair and thread count, one `edgellm bench` child and one `llama-bench`
child (-p / -n, 1 repetition each inside, so both time the same amount of work); the children
alternate so that both see the same machine, and the medians over rounds are printed with
their ratios (edgellm / llama.cpp), decode (tg) and prefill (pp). Quote `uptime` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def edgellm_run(path: str, threads: int, p: int, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "edgellm", "bench", "-m", path, "-t", str(threads),
                          "-p", str(p), "-n", str(n), "-r", "3", "--json"],
                         capture_output=True, text=True, env=env, check=True, timeout=3600)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"pp": r["pp_tok_s"], "tg": r["tg_tok_s"]}


def llama_run(bench: str, gguf: str, threads: int, p: int, n: int) -> dict:
    out = subprocess.run([bench, "-m", gguf, "-t", str(threads), "-p", str(p), "-n", str(n),
                          "-r", "3", "-o", "json"], capture_output=True, text=True, check=True,
                         timeout=3600)
    rows = json.loads(out.stdout)
    got = {}
    for r in rows:
        key = "pp" if r.get("n_prompt", 0) and not r.get("n_gen", 0) else "tg"
        got[key] = r["avg_ts"]
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, action="append", required=True,
                    metavar=("EDGELLM_FILE", "GGUF_FILE"))
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    runs: dict = {}
    for rnd in range(args.rounds):
        for ours, gguf in args.pair:
            for t in args.threads:
                key = f"{Path(gguf).name} t={t}"
                order = (0, 1) if rnd % 2 == 0 else (1, 0)  # who goes first alternates
                for who in order:
                    r = edgellm_run(ours, t, args.n_prompt, args.n_gen) if who == 0 else \
                        llama_run(args.llama_bench, gguf, t, args.n_prompt, args.n_gen)
                    runs.setdefault(key, {}).setdefault("edgellm" if who == 0 else "llama.cpp",
                                                        []).append(r)
                print(f"round {rnd + 1}: {key}: {runs[key]}", file=sys.stderr, flush=True)
    load = os.getloadavg()
    summary = {"loadavg": load}
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for key, r in runs.items():
        med = {who: {m: statistics.median(x[m] for x in v) for m in ("pp", "tg")}
               for who, v in r.items()}
        ratio = {m: med["edgellm"][m] / med["llama.cpp"][m] for m in ("pp", "tg")}
        summary[key] = {"median": med, "ratio": ratio}
        print(f"{key}: decode edgellm {med['edgellm']['tg']:.1f} / llama.cpp "
              f"{med['llama.cpp']['tg']:.1f} tok/s ({ratio['tg']:.2f}x); prefill "
              f"{args.n_prompt}: {med['edgellm']['pp']:.1f} / {med['llama.cpp']['pp']:.1f} "
              f"({ratio['pp']:.2f}x)")
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
