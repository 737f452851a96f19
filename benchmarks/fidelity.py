"""How many greedy tokens each path follows the float model: SmolLM2-135M-Instruct Q4_1.

    python benchmarks/fidelity.py [--gguf Q4_1.gguf] [--model FILE.edgellm] [-n 64]
        [--work DIR] [--llama-server PATH] [--json OUT]

Reference: transformers' float32 model on the GGUF's weights (dequantized by
transformers), greedy, cached in --work. Every path gets the same prompt ids (the Hugging
Face tokenizer's) and is scored by the length of its common prefix with the reference:
  int16      edgellm's default: int16 activation blocks (prefill and decode)
  int8       int8 activation blocks, llama.cpp's (the default before issue 20)
  precise    float activations everywhere (--precise)
  llama.cpp  llama-server (the vendored build) on the same GGUF, temperature 0
  int16/f32  (or int16/q8_0, precise/f16, ...) a path with its KV cache in that kv_type
             (the others: the default, f16)
The fixture's two prompts (../shared/fixtures/smollm2-135m-instruct) come first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

GGUF = "/root/.cache/edgellm-test/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "/root/.cache/edgellm/models/smollm2-135m-instruct.edgellm"
SERVER = "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"

# (name, chat messages or None, plain text or None)
PROMPTS = [
    ("capital", [{"role": "user", "content": "What is the capital of France?"}], None),
    ("story", [{"role": "user", "content":
                "Write a short story about a robot who learns to paint."}], None),
    ("colour", [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "Name a primary colour."}], None),
    ("joke", [{"role": "user", "content": "Hi!"},
              {"role": "assistant", "content": "Hello! How can I help?"},
              {"role": "user", "content": "Tell me a joke about cats."}], None),
    ("python", [{"role": "user", "content": "How do I reverse a list in Python?"}], None),
    ("photosynthesis", [{"role": "user", "content":
                         "Explain photosynthesis in two sentences."}], None),
    ("rome", None, "The Roman Empire was"),
    ("village", None, "Once upon a time, in a small village by the sea,"),
    ("fib", None, "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
]


def prompt_ids(tok, messages, text) -> list[int]:
    if messages is not None:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def references(gguf: str, n: int, work: Path) -> dict:
    """{name: (prompt ids, greedy ids)} of transformers' float32 model (cached)."""
    cache = work / f"fidelity-ref-{n}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    out = {}
    for name, messages, text in PROMPTS:
        ids = prompt_ids(tok, messages, text)
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                               pad_token_id=tok.eos_token_id)
        out[name] = (ids, g[0, len(ids):].tolist())
    work.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def edgellm_greedy(path: str, mode: str, refs: dict, n: int) -> dict:
    """{name: greedy ids} of edgellm in `mode` (int16 | int8 | precise, "/KV_TYPE")."""
    import edgellm
    from edgellm import loader
    from edgellm.cache.kv_types import DEFAULT_KV_TYPE

    mode, _, kv_type = mode.partition("/")
    kv_type = kv_type or DEFAULT_KV_TYPE
    llm = edgellm.load(path, precise=mode == "precise", context=1024, kv_type=kv_type)
    if mode == "int8":
        llm.model = loader.build(llm.packed, context=1024, act_dtype=np.int8, kv_type=kv_type)
    m = llm.model
    eos = set(llm.packed.config.get("eos_token_ids", []) or []) | {2}
    out = {}
    for name, (ids, _) in refs.items():
        m.reset()
        logits = m.forward(np.array(ids), "last")
        gen = []
        for _ in range(n):
            t = int(np.argmax(logits))
            gen.append(t)
            if t in eos:
                break
            logits = m.forward(np.array([t]), "last")
        out[name] = gen
    llm.close()
    return out


def llama_greedy(server: str, gguf: str, refs: dict, n: int) -> dict:
    """{name: greedy ids} of llama-server at temperature 0 (2 threads)."""
    port = 18000 + os.getpid() % 1000
    p = subprocess.Popen([server, "-m", gguf, "-t", "2", "-c", "1024", "--port", str(port),
                          "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        out = {}
        for name, (ids, _) in refs.items():
            body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1,
                               "cache_prompt": False, "return_tokens": True}).encode()
            r = urllib.request.urlopen(urllib.request.Request(
                url + "/completion", body, {"Content-Type": "application/json"}), timeout=120)
            out[name] = json.loads(r.read())["tokens"]
        return out
    finally:
        p.terminate()
        p.wait()


def common(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--work", default="/tmp/edgellm-fidelity")
    ap.add_argument("--llama-server", default=SERVER)
    ap.add_argument("--modes", nargs="+", default=["int16", "int8", "precise", "llama.cpp"])
    ap.add_argument("--json")
    a = ap.parse_args()
    refs = references(a.gguf, a.n, Path(a.work))
    runs = {}
    for mode in a.modes:
        runs[mode] = (llama_greedy(a.llama_server, a.gguf, refs, a.n) if mode == "llama.cpp"
                      else edgellm_greedy(a.model, mode, refs, a.n))
    print(f"{'prompt':16s} {'ref':>4s} " + " ".join(f"{m:>9s}" for m in a.modes))
    table = {}
    for name, (_, ref) in refs.items():
        row = {m: common(runs[m][name], ref) for m in a.modes}
        table[name] = dict(row, ref=len(ref))
        print(f"{name:16s} {len(ref):4d} " + " ".join(f"{row[m]:9d}" for m in a.modes))
    if a.json:
        Path(a.json).write_text(json.dumps({"table": table, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
