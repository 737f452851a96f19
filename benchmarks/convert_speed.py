"""Conversion speed and peak memory on a random float32 checkpoint in SmolLM2-135M's shapes.

    python benchmarks/convert_speed.py [--quant q4_0_mixed] [--keep DIR]

Writes the checkpoint (about 540 MB) to a temporary directory, then runs convert-model in a
child process and reports MB of source per second and the child's peak RSS above the
interpreter's baseline (a `python -c "import converter.pack"` measured the same way).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=576,
              intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, head_dim=64, vocab_size=49152, rms_norm_eps=1e-5,
              max_position_embeddings=8192, tie_word_embeddings=True,
              rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})


def write_checkpoint(root: Path) -> int:
    rng = np.random.default_rng(0)
    D, F, L, V, kv = 576, 1536, 30, 49152, 192
    t = {"model.embed_tokens.weight": rng.standard_normal((V, D), np.float32) * 0.02,
         "model.norm.weight": np.ones(D, np.float32)}
    for i in range(L):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (D, D)), ("self_attn.k_proj", (kv, D)),
                            ("self_attn.v_proj", (kv, D)), ("self_attn.o_proj", (D, D)),
                            ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)),
                            ("mlp.down_proj", (D, F))):
            t[p + name + ".weight"] = rng.standard_normal(shape, np.float32) * 0.02
        t[p + "input_layernorm.weight"] = np.ones(D, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(D, np.float32)
    save_file(t, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(CONFIG))
    return sum(a.nbytes for a in t.values())


def peak_rss_of(cmd: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of a child process."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.execvp(cmd[0], cmd)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"failed: {' '.join(cmd)}")
    return time.perf_counter() - t0, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", default="q4_0_mixed")
    ap.add_argument("--keep", help="directory to keep the checkpoint in")
    a = ap.parse_args()
    root = Path(a.keep or tempfile.mkdtemp(prefix="edgellm-convbench-"))
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "model.safetensors").exists():
        write_checkpoint(root)
    src_bytes = (root / "model.safetensors").stat().st_size
    _, base = peak_rss_of([sys.executable, "-c", "import converter.pack, converter.hf_source"])
    out = root / "out.edgellm"
    secs, peak = peak_rss_of([sys.executable, "-m", "converter", str(root), str(out),
                              "--quant", a.quant, "-q"])
    print(json.dumps({"quant": a.quant, "source_mb": round(src_bytes / 1e6, 1),
                      "seconds": round(secs, 2), "mb_per_s": round(src_bytes / 1e6 / secs, 1),
                      "peak_rss_mb": round(peak / 2**20, 1),
                      "baseline_rss_mb": round(base / 2**20, 1),
                      "above_baseline_mb": round((peak - base) / 2**20, 1),
                      "out_mb": round(out.stat().st_size / 1e6, 1)}))


if __name__ == "__main__":
    main()
