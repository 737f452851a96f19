"""Decode speed with a LoRA adapter on every projection vs without, in one process.

    python benchmarks/lora_decode.py [--model FILE] [--ranks 8 16 64] [--threads 1 2]
                                     [--tokens 64] [--rounds 7]

A random adapter of each rank on q, k, v, o, gate, up and down of every layer (written as
a PEFT directory, read as users' adapters are) is switched in with LLM.set_lora, and the
runtimes alternate round by round (no adapter, then each rank, in a rotating order), so a
load change on the machine hits all of them alike. Each round times `--tokens` decode
steps (the fused step, where the model has one) after a short prompt; the ratio quoted is
the median over rounds of (tokens/s with the adapter) / (tokens/s without, same round).
Quote `uptime`'s load average with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

MODEL = os.path.expanduser("~/.cache/edgellm/models/smollm2-135m-instruct.edgellm")
TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def random_adapter(llm, rank: int, root: str) -> str:
    """A PEFT directory with a random rank-`rank` adapter on every projection."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(rank)
    tensors = {}
    for i in range(llm.args.num_hidden_layers):
        for t in TARGETS:
            N, K = llm.model.packed.tensor(f"model.layers.{i}.{t}.weight").shape
            key = f"base_model.model.model.layers.{i}.{t}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, K)) / K).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((N, rank)) / rank).astype(np.float32)
    out = os.path.join(root, f"rank{rank}")
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": rank,
                   "target_modules": [t.split(".")[1] for t in TARGETS]}, f)
    return out


def decode_rate(llm, n: int) -> float:
    """Tokens/s of n decode steps after an 8-token prompt."""
    m = llm.model
    m.reset()
    m.forward(list(range(10, 18)), want="last")
    t = time.perf_counter()
    for k in range(n):
        m.forward([100 + k], want="last")
    return n / (time.perf_counter() - t)


def run(path: str, threads: int, ranks: list[int], n: int, rounds: int, root: str) -> dict:
    import edgellm

    with edgellm.load(path, threads=threads) as llm:
        adapters = {r: random_adapter(llm, r, root) for r in ranks}
        configs = [None] + ranks
        rates: dict = {c: [] for c in configs}
        for c in configs:  # warm: compile, first touch of each adapter's arrays
            llm.set_lora(adapters[c] if c else None)
            decode_rate(llm, 8)
        fused = llm.model.fused is not None
        for k in range(rounds):
            order = configs[k % len(configs):] + configs[:k % len(configs)]
            for c in order:
                llm.set_lora(adapters[c] if c else None)
                rates[c].append(decode_rate(llm, n))
    base = rates[None]
    return {"threads": threads, "fused": fused,
            "base_tok_s": statistics.median(base),
            "ranks": {r: {"tok_s": statistics.median(rates[r]),
                          "ratio": statistics.median(a / b for a, b in zip(rates[r], base))}
                      for r in ranks}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    with tempfile.TemporaryDirectory() as root:
        for t in a.threads:
            r = run(a.model, t, a.ranks, a.tokens, a.rounds, root)
            line = ", ".join(f"rank {k}: {v['tok_s']:.1f} tok/s ({v['ratio']:.3f}x)"
                             for k, v in r["ranks"].items())
            print(f"{t} thread(s){'' if r['fused'] else ' (per-op path)'}: no adapter "
                  f"{r['base_tok_s']:.1f} tok/s; {line}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
