"""edgellm against llama.cpp at the sizes people run: synthetic 0.4-2B files with real shapes.

    python benchmarks/scale.py [--shapes 360m 1.7b llama-1b] [--types q4_0 q4_k_m q8_0]
        [--threads 1 2] [--rounds 3] [--reps 3] [-p 128] [-n 64] [--isa native|portable|avx2]
        [--act-type int16|int8] [--llama-dir DIR] [--llama-bench PATH] [--work-dir DIR]
        [--keep] [--reconvert] [--json OUT]

Files (cached in --work-dir, default ~/.cache/edgellm/scale; made once, reused):
- SHAPE.f16.gguf: llama-architecture GGUF with the shape's real dimensions, random weights
  (normal, std 0.02, seeded), norms 1, and the default model's (SmolLM2's) tokenizer and
  chat template copied from its GGUF (`edgellm pull`'s source file). The Llama-3.2-1B shape
  keeps its own vocabulary size (128256): SmolLM2's 49152 tokens, then unused padding tokens
  (`<|synthetic_pad_N|>`, type UNUSED) whose embeddings are random like the rest; its RoPE
  is plain (no llama3 frequency scaling: same cost). Deleted after quantizing unless --keep.
- SHAPE.TYPE.gguf: `llama-quantize SHAPE.f16.gguf ... TYPE` (llama.cpp's own mixes).
- SHAPE.TYPE.edgellm: `convert-model SHAPE.TYPE.gguf` (each tensor keeps its type);
  --reconvert remakes it (after a change of the file format or the converter).

Per round, file and thread count T, llama.cpp's `llama-bench -p P -n N -r REPS -t T` and
`edgellm bench -p P -n N -r REPS -t T --ctx P+N` run one after the other (their order
alternating from round to round), then a streaming read of the file's weight bytes per
token (every tensor: the tied embedding is also the output matrix, read whole each token)
by a numba prange sum on T threads, best of 10 passes: the memory-bandwidth bound in
tokens/s. Peak RSS of each child comes from /usr/bin/time. edgellm's kernels are compiled
into numba's cache by an untimed warm-up run first (compiling would inflate its peak RSS).
`--isa` runs edgellm (and the roofline's sum) with EDGELLM_ISA set to it (runtime/
numba_setup.py): `portable` is the generic vector path on this CPU, `avx2` what an AVX2
machine without AVX-512 runs (the generic path, compiled for Haswell). Give --llama-bench a
llama.cpp built the same way (GGML_NATIVE=OFF, GGML_AVX2=ON, GGML_AVX512=OFF) to compare
like with like; its instruction set is read from its binary and each row names both
(the ISA column: edgellm's / llama.cpp's). edgellm's decode is timed after the P-token
prompt, llama-bench's from an empty context, so the decode ratio slightly understates
edgellm's.
Values are medians over rounds (min-max when rounds > 1); ratios are edgellm / llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# name: (label, hidden, layers, ffn, heads, kv heads, vocab, rope theta, context)
SHAPES = {
    "360m": ("SmolLM2-360M", 960, 32, 2560, 15, 5, 49152, 100000.0, 8192),
    "1.7b": ("SmolLM2-1.7B", 2048, 24, 8192, 32, 32, 49152, 130000.0, 8192),
    "llama-1b": ("Llama-3.2-1B", 2048, 16, 8192, 32, 8, 128256, 500000.0, 131072),
}
HEAD_DIM = 64  # all three
# llama-quantize type -> approximate bits per weight (for the disk-space check only)
TYPES = {"q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0, "q8_0": 8.5, "q2_k": 3.4,
         "q3_k_m": 3.9, "q4_k_s": 4.6, "q4_k_m": 4.9, "q5_k_m": 5.7, "q6_k": 6.6}
UNUSED = 5  # llama.cpp's token type for padding tokens

ROOFLINE = r"""
import sys, time
import numpy as np
from edgellm.runtime import numba_setup  # edgellm's threading layer (omp) and EDGELLM_ISA
import numba
from numba import njit, prange

@njit
def part_sum(a):  # a plain loop LLVM vectorizes (inlined in the prange body it does not)
    s = 0
    for i in range(a.size):
        s += a[i]
    return s

@njit(parallel=True)
def stream(a, parts):
    step = (a.size + parts - 1) // parts
    total = 0
    for p in prange(parts):
        total += part_sum(a[p * step:(p + 1) * step])
    return total

nbytes, threads = int(sys.argv[1]), int(sys.argv[2])
numba.set_num_threads(threads)
a = np.ones(nbytes // 8, np.int64)  # touched: every page resident before timing
stream(a, threads)
best = 1e9
for _ in range(10):
    t0 = time.perf_counter()
    stream(a, threads)
    best = min(best, time.perf_counter() - t0)
print(best)
"""


class Failed(Exception):
    """A step failed: its one-line reason."""


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- tools --------------------------------------------------------------------------------

def find_tool(name: str, llama_dir: str | None) -> str:
    dirs = [llama_dir] if llama_dir else []
    if not llama_dir and os.environ.get("LLAMA_CPP_DIR"):
        d = os.environ["LLAMA_CPP_DIR"]
        dirs += [d, os.path.join(d, "build", "bin"), os.path.join(d, "bin")]
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = None if llama_dir else shutil.which(name)
    if not found:
        where = f"in {llama_dir}" if llama_dir else "on PATH or under $LLAMA_CPP_DIR"
        raise Failed(f"{name} not found {where} (give --llama-dir)")
    return found


def child(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> tuple[str, float]:
    """Run cmd; (stdout, peak RSS in MiB from /usr/bin/time, nan without it)."""
    extra = env or {}  # a value "" unsets the variable
    env = {k: v for k, v in dict(os.environ, PYTHONPATH=str(ROOT)).items() if k not in extra}
    env.update({k: v for k, v in extra.items() if v != ""})
    rss = float("nan")
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as f:
        timed = ["/usr/bin/time", "-f", "%M", "-o", f.name, *cmd] \
            if os.access("/usr/bin/time", os.X_OK) else cmd
        try:
            r = subprocess.run(timed, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failed(f"{Path(cmd[0]).name} timed out after {timeout:.0f} s") from None
        if r.returncode:
            tail = " | ".join(r.stderr.strip().splitlines()[-3:])
            raise Failed(f"{' '.join(cmd)} failed (exit {r.returncode}): {tail}")
        if timed is not cmd:
            lines = f.read().split()
            if lines and lines[-1].isdigit():
                rss = int(lines[-1]) / 1024
    return r.stdout, rss


# ---- the files ----------------------------------------------------------------------------

def source_gguf() -> str:
    """The default model's GGUF (downloaded and verified by edgellm's pull if need be)."""
    from edgellm.pull import catalog, fetch_source

    path = fetch_source(catalog()["default"], say=say)
    if path.suffix != ".gguf":
        raise Failed(f"the default model's source {path} is not a GGUF file")
    return str(path)


def tokenizer_fields(src: str, vocab: int) -> list[tuple]:
    """[(key, value, type, sub_type)] of src's tokenizer.* metadata, padded to `vocab`."""
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(src)
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        out.append([key, f.contents(), f.types[0], sub])
    fields = {x[0]: x for x in out}
    tokens = fields["tokenizer.ggml.tokens"][1]
    if vocab < len(tokens):
        raise Failed(f"vocabulary {vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    pad = vocab - len(tokens)
    fields["tokenizer.ggml.tokens"][1] = tokens + [f"<|synthetic_pad_{i}|>" for i in range(pad)]
    if "tokenizer.ggml.token_type" in fields:
        fields["tokenizer.ggml.token_type"][1] += [UNUSED] * pad
    if "tokenizer.ggml.scores" in fields:
        fields["tokenizer.ggml.scores"][1] += [0.0] * pad
    return [tuple(x) for x in out]


def tensor_shapes(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """[(GGUF name, numpy shape (out, in))] in llama.cpp's order; embeddings tied."""
    _, d, layers, ffn, heads, kv, vocab, _, _ = SHAPES[shape]
    q, kv = heads * HEAD_DIM, kv * HEAD_DIM
    out = [("token_embd.weight", (vocab, d))]
    for i in range(layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (d,)), (b + "attn_q.weight", (q, d)),
                (b + "attn_k.weight", (kv, d)), (b + "attn_v.weight", (kv, d)),
                (b + "attn_output.weight", (d, q)), (b + "ffn_norm.weight", (d,)),
                (b + "ffn_gate.weight", (ffn, d)), (b + "ffn_up.weight", (ffn, d)),
                (b + "ffn_down.weight", (d, ffn))]
    return out + [("output_norm.weight", (d,))]


def n_params(shape: str) -> int:
    return sum(int(np.prod(s)) for _, s in tensor_shapes(shape))


def write_f16(shape: str, src: str, path: Path) -> None:
    """The shape's F16 GGUF: random normal weights (std 0.02), norms 1, src's tokenizer."""
    from gguf import GGMLQuantizationType, GGUFWriter

    label, d, layers, ffn, heads, kv, vocab, theta, ctx = SHAPES[shape]
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(str(tmp), "llama")
    w.add_name(f"synthetic {label} shape (random weights)")
    w.add_uint32("general.file_type", 1)  # LLAMA_FTYPE_MOSTLY_F16
    for key, value in (("block_count", layers), ("context_length", ctx),
                       ("embedding_length", d), ("feed_forward_length", ffn),
                       ("attention.head_count", heads), ("attention.head_count_kv", kv),
                       ("rope.dimension_count", HEAD_DIM), ("vocab_size", vocab)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", theta)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    for key, value, vtype, sub in tokenizer_fields(src, vocab):
        w.add_key_value(key, value, vtype, sub_type=sub)
    shapes = tensor_shapes(shape)
    for name, s in shapes:
        dtype = np.float32 if len(s) == 1 else np.float16
        w.add_tensor_info(name, s, np.dtype(dtype), int(np.prod(s)) * np.dtype(dtype).itemsize,
                          raw_dtype=GGMLQuantizationType.F32 if len(s) == 1
                          else GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    chunk = 1 << 23
    for _, s in shapes:
        if len(s) == 1:
            w.write_tensor_data(np.ones(s, np.float32))
            continue
        flat = np.empty(int(np.prod(s)), np.float16)
        for lo in range(0, flat.size, chunk):
            part = rng.standard_normal(min(chunk, flat.size - lo), dtype=np.float32)
            flat[lo:lo + part.size] = part * np.float32(0.02)
        w.write_tensor_data(flat.reshape(s))
    w.close()
    os.replace(tmp, path)


def check_disk(work: Path, need: int) -> None:
    free = shutil.disk_usage(work).free
    if free < need * 1.1:
        raise Failed(f"{work}: {free / 1e9:.1f} GB free, the files need ~{need / 1e9:.1f} GB "
                     "(fewer --shapes/--types, or another --work-dir)")


def make_files(a, tools: dict) -> dict[tuple[str, str], tuple[Path, Path]]:
    """{(shape, type): (gguf, edgellm file)}, making whatever is missing."""
    work = Path(a.work_dir).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    files, src = {}, None
    for shape in a.shapes:
        f16 = work / f"{shape}.f16.gguf"
        ggufs = {t: work / f"{shape}.{t}.gguf" for t in a.types}
        missing = [t for t, g in ggufs.items() if not g.exists()]
        params = n_params(shape)
        need = sum(int(params * TYPES[t] / 8) * 2 for t in missing)
        need += 0 if not missing or f16.exists() else params * 2
        check_disk(work, need)
        if missing and not f16.exists():
            src = src or source_gguf()
            say(f"writing {f16.name} ({params / 1e9:.2f} B parameters, F16)")
            write_f16(shape, src, f16)
        for t in missing:
            say(f"llama-quantize {f16.name} -> {ggufs[t].name}")
            tmp = ggufs[t].with_suffix(".tmp")
            quantize = tools.get("llama-quantize") or find_tool("llama-quantize", a.llama_dir)
            child([quantize, str(f16), str(tmp), t.upper(),
                   str(os.cpu_count() or 1)])
            os.replace(tmp, ggufs[t])
        if f16.exists() and not a.keep:
            f16.unlink()
        for t, g in ggufs.items():
            out = g.with_suffix(".edgellm")
            if a.reconvert or not out.exists() or out.stat().st_mtime < g.stat().st_mtime:
                say(f"convert-model {g.name} -> {out.name}")
                child([sys.executable, "-m", "converter", str(g), str(out), "-q"])
            files[(shape, t)] = (g, out)
    return files


def weight_bytes(gguf_path: Path) -> int:
    """Bytes of weights read per decoded token: every tensor, but the token embedding only
    when it is also the output matrix (tied)."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(gguf_path)).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if tied or t.name != "token_embd.weight")


# ---- the runs -----------------------------------------------------------------------------

def edgellm_env(isa: str) -> dict:
    """EDGELLM_ISA=isa; the settings it makes itself are left to it."""
    return {"EDGELLM_ISA": isa, "EDGELLM_PORTABLE": "", "NUMBA_CPU_NAME": "",
            "NUMBA_CPU_FEATURES": ""}


def llama_isa(llama_bench: str) -> str:
    """The widest x86 vector instructions in llama-bench's CPU backend: "avx512" if any of
    its ggml-cpu code touches a zmm register, "avx2" if a ymm one, else "?" (aarch64, or no
    objdump). The backend is the ggml-cpu library beside it when built shared."""
    here = Path(llama_bench).resolve().parent
    libs = sorted(here.glob("libggml-cpu*.so")) or [Path(llama_bench)]
    if not shutil.which("objdump"):
        return "?"
    seen = "?"
    for lib in libs:
        r = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)],
                           capture_output=True, text=True)
        if "%zmm" in r.stdout:
            return "avx512"
        if "%ymm" in r.stdout:
            seen = "avx2"
    return seen


def edgellm_cmd(a, model: Path, t: int, p: int, n: int, reps: int) -> list[str]:
    cmd = [sys.executable, "-m", "edgellm", "bench", "-m", str(model), "-t", str(t),
           "-p", str(p), "-n", str(n), "-r", str(reps), "--ctx", str(max(p + n, 8)), "--json"]
    return cmd + (["--act-type", a.act_type] if a.act_type else [])


def run_edgellm(a, model: Path, t: int) -> dict:
    out, rss = child(edgellm_cmd(a, model, t, a.p, a.n, a.reps), edgellm_env(a.isa))
    js = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])
    return {"pp": js["pp_tok_s"], "tg": js["tg_tok_s"], "rss": rss}


def run_llama(a, tools: dict, gguf_path: Path, t: int) -> dict:
    out, rss = child([tools["llama-bench"], "-m", str(gguf_path), "-t", str(t), "-p", str(a.p),
                      "-n", str(a.n), "-r", str(a.reps), "-o", "json"])
    res = {"rss": rss}
    for row in json.loads(out):
        res["tg" if row["n_gen"] else "pp"] = row["avg_ts"]
    return res


def run_roofline(nbytes: int, t: int, isa: str) -> dict:
    out, _ = child([sys.executable, "-c", ROOFLINE, str(nbytes), str(t)], edgellm_env(isa))
    seconds = float(out.split()[-1])
    return {"tok_s": 1 / seconds, "gb_s": nbytes / seconds / 1e9}


# ---- the table ----------------------------------------------------------------------------

def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}-{fmt.format(hi)}"


def table(rows: dict, sizes: dict, isa: str) -> str:
    """The markdown table; `isa` is the ISA column (edgellm's / llama.cpp's)."""
    head = ("| file (synthetic shape) | ISA | threads | llama.cpp pp / tg tok/s | "
            "edgellm pp / tg | ratio pp / tg | bound tg tok/s (GB/s) | "
            "tg % of bound llama.cpp / edgellm | "
            "peak RSS MiB llama.cpp / edgellm | load before→after |")
    lines = [head, "|" + "---|" * head.count(" |")]
    for (shape, typ, t), runs in rows.items():
        L, E, R = runs["llama.cpp"], runs["edgellm"], runs["roofline"]

        def m(rs, k):
            return statistics.median(r[k] for r in rs)
        bound = m(R, "tok_s")
        lines.append(
            f"| {SHAPES[shape][0]} {typ.upper()} ({sizes[(shape, typ)] / 1e6:,.0f} MB) | {isa} | "
            f"{t} | "
            f"{spread([r['pp'] for r in L], '{:.0f}')} / {spread([r['tg'] for r in L])} | "
            f"{spread([r['pp'] for r in E], '{:.0f}')} / {spread([r['tg'] for r in E])} | "
            f"{m(E, 'pp') / m(L, 'pp'):.2f}x / {m(E, 'tg') / m(L, 'tg'):.2f}x | "
            f"{bound:.1f} ({m(R, 'gb_s'):.1f}) | "
            f"{100 * m(L, 'tg') / bound:.0f}% / {100 * m(E, 'tg') / bound:.0f}% | "
            f"{m(L, 'rss'):.0f} / {m(E, 'rss'):.0f} | "
            + ", ".join(f"{b:.2f}→{e:.2f}" for b, e in runs["load"]) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=["360m", "1.7b"])
    ap.add_argument("--types", nargs="+", choices=tuple(TYPES),
                    default=["q4_0", "q4_k_m", "q8_0"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside each bench (3)")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens (128)")
    ap.add_argument("-n", type=int, default=64, help="generated tokens (64)")
    ap.add_argument("--isa", choices=("native", "portable", "avx2"), default="native",
                    help="EDGELLM_ISA for edgellm: native (this CPU's best path), portable "
                         "(the generic vector path), avx2 (the generic path compiled for an "
                         "AVX2 CPU without AVX-512)")
    ap.add_argument("--act-type", default=None, help="passed to edgellm bench (its default)")
    ap.add_argument("--llama-dir", default=None,
                    help="directory of llama-bench and llama-quantize (default: "
                         "$LLAMA_CPP_DIR or its build/bin, then PATH)")
    ap.add_argument("--llama-bench", default=None,
                    help="the llama-bench binary to time (e.g. one built for AVX2 only), "
                         "instead of the one in --llama-dir")
    ap.add_argument("--work-dir", default="~/.cache/edgellm/scale",
                    help="where the files are kept between runs (~/.cache/edgellm/scale)")
    ap.add_argument("--keep", action="store_true", help="keep the F16 GGUF files")
    ap.add_argument("--reconvert", action="store_true", help="remake the .edgellm files")
    ap.add_argument("--json", help="also write every measurement to this file")
    a = ap.parse_args()
    if min(a.threads) < 1 or a.rounds < 1 or a.reps < 1 or a.p < 1 or a.n < 1:
        ap.error("--threads, --rounds, --reps, -p and -n must be >= 1")
    try:
        if a.llama_bench:
            if not (os.path.isfile(a.llama_bench) and os.access(a.llama_bench, os.X_OK)):
                raise Failed(f"--llama-bench {a.llama_bench}: not an executable file")
            tools = {"llama-bench": a.llama_bench}
        else:
            tools = {k: find_tool(k, a.llama_dir) for k in ("llama-bench", "llama-quantize")}
        isa = f"{a.isa} / {llama_isa(tools['llama-bench'])}"
        files = make_files(a, tools)
        sizes = {k: g.stat().st_size for k, (g, _) in files.items()}
        per_token = {k: weight_bytes(g) for k, (g, _) in files.items()}
        for _, model in files.values():  # compile into numba's cache, untimed
            say(f"warm-up: edgellm bench {model.name} ({a.isa})")
            child(edgellm_cmd(a, model, a.threads[0], 8, 2, 1), edgellm_env(a.isa))
        rows: dict = {}
        for rnd in range(a.rounds):
            for key, (g, model) in files.items():
                for t in a.threads:
                    cell = rows.setdefault((*key, t), {"llama.cpp": [], "edgellm": [],
                                                       "roofline": [], "load": []})
                    before = os.getloadavg()[0]
                    order = ["llama.cpp", "edgellm"][::1 if rnd % 2 == 0 else -1]
                    for who in order:
                        r = run_llama(a, tools, g, t) if who == "llama.cpp" \
                            else run_edgellm(a, model, t)
                        cell[who].append(r)
                        say(f"round {rnd + 1} {g.stem} t={t} {who:9s} pp {r['pp']:7.1f}  "
                            f"tg {r['tg']:6.1f}  peak RSS {r['rss']:.0f} MiB")
                    cell["roofline"].append(run_roofline(per_token[key], t, a.isa))
                    cell["load"].append((before, os.getloadavg()[0]))
    except Failed as e:
        print(f"scale.py: {e}", file=sys.stderr)
        return 1
    print(f"\nedgellm (EDGELLM_ISA={a.isa}{', --act-type ' + a.act_type if a.act_type else ''}) "
          f"against {tools['llama-bench']} (its ISA: {isa.split(' / ')[1]}), -p {a.p} "
          f"-n {a.n}, {a.rounds} round(s) of {a.reps} reps, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print(table(rows, sizes, isa))
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"args": vars(a), "isa": isa, "sizes": {"/".join(k): v for k, v in sizes.items()},
             "weight_bytes_per_token": {"/".join(k): v for k, v in per_token.items()},
             "rows": [{"shape": s, "type": ty, "threads": t, **v}
                      for (s, ty, t), v in rows.items()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
