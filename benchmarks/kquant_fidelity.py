"""A K-quant GGUF run as it is: edgellm and llama.cpp against transformers' float model on the
same (dequantized) weights, and greedy text against llama.cpp's.

    python benchmarks/kquant_fidelity.py GGUF EDGELLM_FILE --server http://127.0.0.1:PORT
        [--prompts "..." "..."] [-n 24] [--out results.json]

--server is a running `llama-server -m GGUF` (llama.cpp's own tool; not started here).
For each prompt (token ids from edgellm's tokenizer, sent to llama.cpp as ids):
  greedy     llama.cpp's n greedy tokens (/completion, top_k 1) and edgellm's, decoded one at
             a time; the length of their common prefix
  logprobs   along llama.cpp's continuation, at each position llama.cpp's 10 most likely
             tokens (n_probs, from its raw logits): max |log p - log p_transformers| over
             them, for llama.cpp and for edgellm, and each one's top-1 agreement with
             transformers (log-probs differ from logits by one constant per position, so
             this is the logit distance up to that constant)
transformers reads the GGUF itself (gguf_file=, dequantized to float32): needs torch,
transformers and gguf. Prints one line per prompt and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

import numpy as np

PROMPTS = ("The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th",
           "Once upon a time, in a small village by the sea,")


def llamacpp(server: str, ids: list[int], n: int) -> tuple[list[int], list[dict]]:
    body = json.dumps({"prompt": ids, "n_predict": n, "top_k": 1, "temperature": 0,
                       "n_probs": 10, "cache_prompt": False, "return_tokens": True,
                       "samplers": ["top_k"]}).encode()
    req = urllib.request.Request(server.rstrip("/") + "/completion", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        res = json.loads(r.read())
    return res["tokens"], res["completion_probabilities"]


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("model")
    ap.add_argument("--server", required=True)
    ap.add_argument("--prompts", nargs="+", default=list(PROMPTS))
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    import edgellm

    path = Path(args.gguf).resolve()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                              dtype=torch.float32).eval()
    llm = edgellm.load(args.model)
    results = []
    for prompt in args.prompts:
        ids = llm.encode_prompt(prompt)
        ref_toks, probs = llamacpp(args.server, ids, args.n)
        # edgellm greedy, one token at a time
        llm.model.reset()
        last, mine = llm.model.forward(ids, want="last"), []
        for _ in range(args.n):
            mine.append(int(np.asarray(last).argmax()))
            last = llm.model.forward([mine[-1]], want="last")
        common = next((i for i, (a, b) in enumerate(zip(mine, ref_toks)) if a != b),
                      min(len(mine), len(ref_toks)))
        # log-probs along llama.cpp's continuation
        seq = ids + ref_toks
        with torch.inference_mode():
            t_lp = log_softmax(hf(torch.tensor([seq])).logits[0].float().numpy())
        llm.model.reset()
        e_lp = log_softmax(np.asarray(llm.model.forward(seq, want="all")))
        P = len(ids)
        d_ll, d_ed, top_ll, top_ed = [], [], [], []
        for j, pos in enumerate(probs):
            row = P - 1 + j
            cand = [c for c in pos["top_logprobs"]]
            tids = [c["id"] for c in cand]
            ll = np.array([c["logprob"] for c in cand])
            d_ll.append(np.abs(ll - t_lp[row, tids]).max())
            d_ed.append(np.abs(e_lp[row, tids] - t_lp[row, tids]).max())
            t_top = int(t_lp[row].argmax())
            top_ll.append(tids[0] == t_top)
            top_ed.append(int(e_lp[row].argmax()) == t_top)
        r = {"prompt": prompt, "ids": ids, "llamacpp": ref_toks, "edgellm": mine,
             "common_prefix": common, "llamacpp_max_dlogprob": float(max(d_ll)),
             "edgellm_max_dlogprob": float(max(d_ed)),
             "llamacpp_top1": float(np.mean(top_ll)), "edgellm_top1": float(np.mean(top_ed)),
             "text_llamacpp": llm.tokenizer.decode(ref_toks),
             "text_edgellm": llm.tokenizer.decode(mine)}
        results.append(r)
        print(f"{prompt!r}: greedy common prefix {common}/{args.n}; max |dlogprob| vs "
              f"transformers: llama.cpp {r['llamacpp_max_dlogprob']:.3f}, edgellm "
              f"{r['edgellm_max_dlogprob']:.3f}; top-1 vs transformers: llama.cpp "
              f"{r['llamacpp_top1']:.2f}, edgellm {r['edgellm_top1']:.2f}")
    print(json.dumps(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
