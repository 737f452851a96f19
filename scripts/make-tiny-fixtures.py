"""Tiny random checkpoints of olmo2 and granite with transformers' outputs (tests/fixtures/tiny).

Made as ../shared/fixtures' make_fixtures.py makes the others: a real Hugging Face
directory (save_pretrained), weights drawn N(0, 0.08) and every norm weight and bias
perturbed, the tokenizer files of the llama fixture, and reference.npz:

  input_ids   int64 [40]         the prompt (the same Python source text)
  logits      float32 [40, 512]  one forward over the prompt, no cache
  greedy_ids  int64 [24]         generate(do_sample=False), cache on

Needs torch and transformers (not project dependencies):
  python scripts/make-tiny-fixtures.py [--only olmo2 granite]
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers

TINY = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ARCHS = {
    # post-norm blocks, q/k RMSNorm over the whole projection
    "olmo2": ("Olmo2Config", dict(tie_word_embeddings=False)),
    # embedding, residual, attention and logit multipliers
    "granite": ("GraniteConfig", dict(tie_word_embeddings=False, embedding_multiplier=2.0,
                                      residual_multiplier=0.5, attention_multiplier=0.2,
                                      logits_scaling=0.5)),
}
TEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"


def build(name: str, seed: int) -> None:
    cls_name, overrides = ARCHS[name]
    cfg = getattr(transformers, cls_name)(**{**COMMON, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # larger weights than the default init: logits far from uniform
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            else:  # norm weights and biases: perturbed, so their conventions are tested
                p.add_(torch.randn_like(p) * 0.1)
    out = TINY / name
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    for f in TOKENIZER_FILES:
        shutil.copy(TINY / "llama" / f, out / f)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(out)
    ids = tok(TEXT, return_tensors="pt")["input_ids"][:, :40]
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        gen = model.generate(ids, max_new_tokens=24, do_sample=False, min_new_tokens=24,
                             pad_token_id=0)[0, ids.shape[1]:].numpy()
    np.savez_compressed(out / "reference.npz", input_ids=ids[0].numpy(), logits=logits,
                        greedy_ids=gen)
    print(f"{name}: {ids.shape[1]} tokens, logits {logits.shape}, greedy {gen[:8].tolist()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    for name in a.only or ARCHS:
        build(name, a.seed)
    (TINY / "VERSIONS-olmo2-granite.json").write_text(json.dumps(
        {"transformers": transformers.__version__, "torch": torch.__version__,
         "seed": a.seed}, indent=1) + "\n")


if __name__ == "__main__":
    main()
