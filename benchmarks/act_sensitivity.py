"""Which matrices' int8 activation rounding moves the float model's greedy answers.

    python benchmarks/act_sensitivity.py REFS.json MODEL [-n 96] [--json OUT]
        [--formats int16 int8 int8-except:down_proj int8-only:q_proj,k_proj,v_proj ...]

REFS.json: {prompt name: [prompt ids, the float model's greedy ids]} (benchmarks/
fidelity.py's reference cache, fidelity-ref-N.json in its --work directory, or any file of
that shape). Each format runs every prompt greedily on the per-operation path (prefill and
decode; the fused step computes the same function: tests/test_fused.py), each quantized
matrix's activations quantized to the format's choice for it, and is scored by how many of
the reference's tokens it follows (its common prefix), per prompt and in total:

  int16 | int8                 every matrix in that format (the default; llama.cpp's)
  int8-except:ROLE[,ROLE]      int8, but int16 for these roles
  int8-only:ROLE[,ROLE]        int16, but int8 for these roles
  int8-layers:A-B              int16, but int8 for every matrix of layers A..B (the head
                               int16)
  int8-keep:K                  every matrix's activations int8 but for the K largest |x| of
                               each block of 32, kept exact (a sparse correction of int8,
                               simulated in float: the rounded values on the float path)
  prefill:FORMAT               FORMAT in prefill (the prompt's chunk: its KV rows and the
                               first token's logits), int16 in decode (one-token steps)
A role is the tensor name's part before ".weight" (q_proj k_proj v_proj o_proj gate_proj
up_proj down_proj; qkv_proj gate_up_proj), "head" for the output head (tied or not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

HEAD_NAMES = ("lm_head", "embed_tokens")


def role(name: str) -> str:
    parts = name.split(".")
    r = parts[-2] if len(parts) >= 2 and parts[-1] == "weight" else parts[-1]
    return "head" if r in HEAD_NAMES else r


def layer(name: str) -> int:
    """The layer index in a tensor name (model.layers.N....), -1 for none (the head)."""
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else -1


def parse(spec: str):
    """(name, rows) -> np.int8 | np.int16 for the format `spec` (rows: the call's tokens)."""
    if spec.startswith("prefill:"):
        inner = parse(spec[len("prefill:"):])
        return lambda name, rows: inner(name, rows) if rows > 1 else np.dtype(np.int16)
    of = _parse(spec)
    return lambda name, rows: of(name)


def _parse(spec: str):
    """name -> np.int8 | np.int16 for the format `spec`."""
    if spec.startswith("int8-keep:"):
        k = int(spec.partition(":")[2])
        return lambda name: ("keep", k)
    if spec.startswith("int8-layers:"):
        a, _, b = spec.partition(":")[2].partition("-")
        lo, hi = int(a), int(b or a)
        return lambda name: np.dtype(np.int8 if lo <= layer(name) <= hi else np.int16)
    if spec in ("int16", "int8"):
        return lambda name: np.dtype(spec)
    mode, _, arg = spec.partition(":")
    roles = set(arg.split(","))
    if mode == "int8-except":
        return lambda name: np.dtype(np.int16 if role(name) in roles else np.int8)
    if mode == "int8-only":
        return lambda name: np.dtype(np.int8 if role(name) in roles else np.int16)
    raise SystemExit(f"unknown format {spec!r}")


FORMAT = {"of": parse("int16")}


def _by_format(real):
    """linear() with each matrix's activations in FORMAT's choice for it (a shared copy
    quantized in another format is not used: the matrix quantizes its own)."""
    def linear(w, x, out, *, precise=False, act=None, act_dtype=np.int8):
        dtype = FORMAT["of"](w.name, x.shape[0])
        if isinstance(dtype, tuple):  # ("keep", k): int8 rounding but for k exact a block
            return real(w, keep_int8(x, dtype[1]), out, precise=True)
        if act is not None and act.xq.dtype != dtype:
            act = None
        return real(w, x, out, precise=precise, act=act, act_dtype=dtype)
    return linear


def keep_int8(x: np.ndarray, k: int) -> np.ndarray:
    """x [T, K] rounded as int8 blocks of 32 (d = amax / 127 of the block without its k
    largest |x|), those k values kept exact: float32 [T, K]."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    top = np.zeros(b.shape, bool)
    if k:
        np.put_along_axis(top, np.argsort(-np.abs(b), axis=-1)[..., :k], True, axis=-1)
    rest = np.where(top, np.float32(0), b)
    d = np.abs(rest).max(-1, keepdims=True) / np.float32(127)
    q = np.round(rest / np.where(d == 0, 1, d)) * d
    return np.ascontiguousarray(np.where(top, b, q).reshape(x.shape), np.float32)


def common(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def follow(model, ids: list[int], ref: list[int], eos: set[int]) -> int:
    """How many of ref's tokens greedy decoding after ids reproduces."""
    model.reset()
    logits = model.forward(np.array(ids), "last")
    got: list[int] = []
    for want in ref:
        t = int(np.argmax(logits))
        got.append(t)
        if t != want or t in eos:
            break
        logits = model.forward(np.array([t]), "last")
    return common(got, ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("refs")
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--formats", nargs="+",
                    default=["int16", "int8"]
                    + [f"int8-except:{r}" for r in ("down_proj", "head", "o_proj",
                                                    "gate_proj,up_proj", "q_proj,k_proj,v_proj")]
                    + [f"int8-only:{r}" for r in ("q_proj,k_proj,v_proj", "o_proj",
                                                  "gate_proj,up_proj", "down_proj", "head")])
    ap.add_argument("--json")
    a = ap.parse_args()
    import edgellm
    from edgellm.arch import base, steps

    steps.linear, base.linear = _by_format(steps.linear), _by_format(base.linear)
    refs = {k: (ids, ref[:a.n]) for k, (ids, ref) in json.loads(Path(a.refs).read_text()).items()}
    llm = edgellm.load(a.model, context=1024, fused=False, act_type="int16")
    eos = set(llm.packed.config.get("eos_token_ids", []) or [])
    total = sum(len(r) for _, r in refs.values())
    print(f"{'formats':34s} {'tokens':>9s}  " + " ".join(f"{k[:8]:>8s}" for k in refs))
    print(f"{'(reference)':34s} {total:4d}/{total:<4d}  "
          + " ".join(f"{len(r):8d}" for _, r in refs.values()))
    out = {}
    for spec in a.formats:
        FORMAT["of"] = parse(spec)
        row = {k: follow(llm.model, ids, ref, eos) for k, (ids, ref) in refs.items()}
        out[spec] = row
        print(f"{spec:34s} {sum(row.values()):4d}/{total:<4d}  "
              + " ".join(f"{v:8d}" for v in row.values()), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    llm.close()


if __name__ == "__main__":
    main()
