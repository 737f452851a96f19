"""transformers' float32 prefill speed, the reference the speed issue asks edgellm's against.

    python benchmarks/transformers_prefill.py GGUF_FILE [--threads 1 2] [-p 128] [-r 5]

Runs in an interpreter with torch, transformers, accelerate and gguf installed (none is an
edgellm dependency: `pip install torch transformers accelerate gguf`). transformers reads
the GGUF file and dequantizes it to float32; each repetition is one forward pass over a
fresh prompt of -p random token ids (no KV cache reuse), as `edgellm bench` times its
prefill. Prints the median tokens/s per thread count, and one JSON line with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=5)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    path = Path(args.gguf).resolve()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 torch_dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    result = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = []
        with torch.inference_mode():
            for rep in range(args.reps + 1):  # the first run warms up
                ids = torch.randint(100, vocab, (1, args.n_prompt), generator=gen)
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=False)
                if rep:
                    times.append(time.perf_counter() - t0)
        tok_s = args.n_prompt / statistics.median(times)
        result[threads] = tok_s
        print(f"transformers {transformers.__version__} (torch {torch.__version__}) float32, "
              f"{threads} thread(s): prefill {args.n_prompt} tokens {tok_s:.1f} tok/s "
              f"(median of {args.reps})")
    print(json.dumps({"pp_tok_s": result, "n_prompt": args.n_prompt}))


if __name__ == "__main__":
    main()
