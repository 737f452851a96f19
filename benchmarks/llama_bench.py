"""edgellm's activation paths against llama.cpp's own llama-bench, same GGUF, runs alternating.

    python benchmarks/llama_bench.py [--model FILE.edgellm] [--gguf FILE.gguf]
        [--llama-bench PATH] [--threads 1 2] [--rounds 3] [-p 128] [-n 64]
        [--modes int16 int8 precise] [--json OUT]

Per round and thread count, one child per edgellm mode, then one llama-bench child
(`-p P -n N -r 3 -o json`): every runtime sees the same machine. Modes: int16 (the
default), int8 (int8 activation blocks: the default before issue 20), precise (float
activations). edgellm's decode is timed after the -p prompt (`edgellm bench`'s
measure), llama-bench's tg from an empty context, so the ratio understates edgellm's.
Medians over rounds and their ratios to llama.cpp are printed, with the load average.
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
GGUF = "/root/.cache/edgellm-test/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "/root/.cache/edgellm/models/smollm2-135m-instruct.edgellm"
LLAMA_BENCH = "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench"

CHILD = r"""
import json, statistics, sys
import numpy as np
import edgellm
from edgellm import loader
from edgellm.commands.bench import measure
path, mode, threads, P, N = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = edgellm.load(path, threads=threads, precise=mode == "precise", context=P + N + 16)
if mode == "int8":
    llm.model = loader.build(llm.packed, context=P + N + 16, act_dtype=np.int8)
measure(llm, 8, 2, seed=0)
runs = [measure(llm, P, N, seed=r + 1) for r in range(3)]
print(json.dumps({"pp": statistics.median(r[0] for r in runs),
                  "tg": statistics.median(r[1] for r in runs)}))
"""


def child(cmd: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def edgellm_run(a, mode: str, t: int) -> dict:
    out = child([sys.executable, "-c", CHILD, a.model, mode, str(t), str(a.p), str(a.n)])
    return json.loads(out.strip().splitlines()[-1])


def llama_run(a, t: int) -> dict:
    out = json.loads(child([a.llama_bench, "-m", a.gguf, "-t", str(t), "-p", str(a.p), "-n",
                            str(a.n), "-r", "3", "-o", "json"]))
    res = {}
    for row in out:
        res["pp" if row["n_prompt"] else "tg"] = row["avg_ts"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--llama-bench", default=LLAMA_BENCH)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["int16", "int8", "precise"])
    ap.add_argument("--json")
    a = ap.parse_args()
    res: dict = {}
    loads = []
    for rnd in range(a.rounds):
        for t in a.threads:
            for mode in [*a.modes, "llama.cpp"]:
                r = llama_run(a, t) if mode == "llama.cpp" else edgellm_run(a, mode, t)
                res.setdefault((mode, t), []).append(r)
                print(f"round {rnd} t={t} {mode:9s} pp {r['pp']:7.1f}  tg {r['tg']:6.1f}",
                      flush=True)
        loads.append(os.getloadavg()[0])
    print(f"load average (1 min) after each round: {', '.join(f'{x:.2f}' for x in loads)}")
    table = {}
    for t in a.threads:
        ref = {k: statistics.median(r[k] for r in res[("llama.cpp", t)]) for k in ("pp", "tg")}
        for mode in [*a.modes, "llama.cpp"]:
            med = {k: statistics.median(r[k] for r in res[(mode, t)]) for k in ("pp", "tg")}
            table[f"{mode}@{t}"] = med
            print(f"t={t} {mode:9s} pp{a.p} {med['pp']:7.1f} ({med['pp'] / ref['pp']:.2f}x)  "
                  f"tg{a.n} {med['tg']:6.1f} ({med['tg'] / ref['tg']:.2f}x)")
    if a.json:
        Path(a.json).write_text(json.dumps({"table": table, "loads": loads}, indent=1))


if __name__ == "__main__":
    main()
