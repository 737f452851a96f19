"""edgellm against llama.cpp on the same weights and threads, runs alternating.

    python benchmarks/compare_llamacpp.py --pair EDGELLM_FILE GGUF_FILE [--pair ...]
        [--threads 1 2] [--rounds 5] [-p 128] [-n 64] [--llama-python PY] [--json OUT]

Each round runs, per pair and thread count, one `edgellm bench` child and one llama.cpp
child (through llama-cpp-python, in the interpreter --llama-python, which must have it
installed: `pip install llama-cpp-python`). Children alternate so that both see the same
machine; the medians over rounds are printed with their ratios. Peak RSS is the child's
(ru_maxrss). A memory-bandwidth probe (numpy sum over 512 MB) runs in the same run, for
the decode roofline fraction: weight bytes read per token x tokens/s / bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

LLAMA_BENCH = r"""
import json, sys, time
import llama_cpp
path, threads, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(path, n_threads=threads, n_threads_batch=threads,
                      n_ctx=n_prompt + n_gen + 8, n_batch=n_prompt, verbose=False)
vocab = llm.n_vocab()
import random
rng = random.Random(1)
def once():
    llm.reset()
    prompt = [rng.randrange(100, vocab) for _ in range(n_prompt)]
    t0 = time.perf_counter(); llm.eval(prompt); t1 = time.perf_counter()
    tok = 100
    for _ in range(n_gen):
        llm.eval([tok]); tok = (tok * 7 + 13) % vocab
    t2 = time.perf_counter()
    return n_prompt / (t1 - t0), n_gen / (t2 - t1), t1 - t0
once()
runs = [once() for _ in range(3)]
med = [sorted(r[i] for r in runs)[1] for i in range(3)]
print(json.dumps({"pp_tok_s": med[0], "tg_tok_s": med[1], "ttft_s": med[2],
                  "peak_rss_mb": [int(l.split()[1]) / 1024 for l in open("/proc/self/status")
                                  if l.startswith("VmHWM:")][0]}))
"""


def bandwidth_gbs() -> float:
    """Memory read bandwidth: a numpy sum over 512 MB (best of 3)."""
    import numpy as np

    a = np.ones(512 * 2**20 // 8)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def run_child(cmd: list[str], env=None) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def edgellm_run(model: str, threads: int, a, precise: bool = False) -> dict:
    cmd = [sys.executable, "-m", "edgellm", "bench", "-m", model, "-t", str(threads), "-p",
           str(a.n_prompt), "-n", str(a.n_gen), "-r", "3", "--json",
           "--ctx", str(max(512, a.n_prompt + a.n_gen + 8))]
    return run_child(cmd + (["--precise"] if precise else []))


def llama_run(gguf: str, threads: int, a, script: str) -> dict:
    return run_child([a.llama_python, script, gguf, str(threads), str(a.n_prompt),
                      str(a.n_gen)])


def weight_bytes(model: str) -> int:
    """Bytes of matrices a decode step reads (everything but the embedding lookup)."""
    from edgellm.modelfile.format import PackedModel

    with PackedModel(model) as p:
        tied = "lm_head.weight" not in p.tensors
        return sum(t.nbytes for n, t in p.tensors.items()
                   if n != "model.embed_tokens.weight" or tied)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, action="append", required=True,
                    metavar=("EDGELLM_FILE", "GGUF_FILE"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--precise", action="store_true", help="also run edgellm --precise")
    ap.add_argument("--json", help="write all figures to this file")
    a = ap.parse_args()
    fd, script = tempfile.mkstemp(suffix=".py")
    os.write(fd, LLAMA_BENCH.encode())
    os.close(fd)
    results: dict = {}
    bw = bandwidth_gbs()
    try:
        for r in range(a.rounds):
            for model, gguf in a.pair:
                for t in a.threads:
                    runs = [("edgellm", edgellm_run, (model, t, a)),
                            ("llama.cpp", llama_run, (gguf, t, a, script))]
                    if a.precise:
                        runs.append(("edgellm precise", edgellm_run, (model, t, a, True)))
                    for name, fn, args in (runs if r % 2 == 0 else runs[::-1]):
                        key = f"{os.path.basename(model)} | {name} | {t}t"
                        results.setdefault(key, []).append(fn(*args))
                        print(f"round {r + 1}: {key}: {results[key][-1]}", file=sys.stderr)
    finally:
        os.unlink(script)
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("pp_tok_s", "tg_tok_s",
                                                              "ttft_s", "peak_rss_mb")}
           for k, v in results.items()}
    print(f"memory bandwidth (numpy sum, 512 MB): {bw:.1f} GB/s")
    print(f"{'model | runtime | threads':60s} {'pp tok/s':>9s} {'tg tok/s':>9s} "
          f"{'ttft ms':>8s} {'RSS MiB':>8s}")
    for k, m in med.items():
        print(f"{k:60s} {m['pp_tok_s']:9.1f} {m['tg_tok_s']:9.1f} {m['ttft_s'] * 1000:8.0f} "
              f"{m['peak_rss_mb']:8.0f}")
    print("ratios edgellm / llama.cpp:")
    for model, _ in a.pair:
        wb = weight_bytes(model)
        for t in a.threads:
            e = med[f"{os.path.basename(model)} | edgellm | {t}t"]
            lc = med[f"{os.path.basename(model)} | llama.cpp | {t}t"]
            roof = wb * e["tg_tok_s"] / (bw * 1e9)
            print(f"  {os.path.basename(model)} {t}t: decode x{e['tg_tok_s'] / lc['tg_tok_s']:.2f}"
                  f", prefill x{e['pp_tok_s'] / lc['pp_tok_s']:.2f}, RSS "
                  f"{e['peak_rss_mb'] - lc['peak_rss_mb']:+.0f} MiB, decode roofline "
                  f"{roof:.0%} ({wb / 1e6:.0f} MB per token)")
            p = med.get(f"{os.path.basename(model)} | edgellm precise | {t}t")
            if p:
                print(f"    precise / default: decode x{p['tg_tok_s'] / e['tg_tok_s']:.2f}, "
                      f"prefill x{p['pp_tok_s'] / e['pp_tok_s']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bandwidth_gbs": bw, "medians": med, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
