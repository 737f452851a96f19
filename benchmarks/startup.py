"""First run, warm start and peak memory of `edgellm generate`, against llama.cpp's llama-bench.

    python benchmarks/startup.py [--model FILE.edgellm] [--gguf FILE.gguf]
        [--llama-bench PATH] [--rounds 3] [--threads 2] [--skip-cold]

cold   a fresh EDGELLM_HOME (a temporary directory: its kernel cache empty; the model file
       is linked in, already converted): `edgellm generate -n 1`, its time to the first
       byte of output (the token: the variants are compiled after it), wall and CPU
       seconds; then `-t 1` and `--precise` runs, which must
       compile nothing (the lines "edgellm: compiling kernels N" they print are counted).
warm   --rounds alternating rounds of `python -c "import numba"` and `edgellm generate
       -n 1` (after one run that fills the kernel cache of the environment's EDGELLM_HOME
       or NUMBA_CACHE_DIR, if it was cold): median wall times and their ratio.
memory peak RSS (wait4's ru_maxrss of each child) of `edgellm generate` decoding 64 tokens
       after a 128-token prompt, and of `llama-bench -p 128 -n 64 -r 1` on the GGUF the
       model was converted from, alternating: medians and the difference.
Every figure is printed with the load average (os.getloadavg) at the time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GGUF = "/root/.cache/edgellm-test/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "/root/.cache/edgellm/models/smollm2-135m-instruct.edgellm"
LLAMA_BENCH = "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench"
# ~128 tokens of SmolLM2's tokenizer
PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening, counting the "
          "steps as his father had taught him, and at the top he wiped the salt from the "
          "great lens before lighting the lamp. Ships passed far out in the dark, and he "
          "wrote each one in his book: the hour, the direction, the colour of its lights. "
          "One winter night a small boat came close to the rocks, its sail torn, and the "
          "keeper ran down to the shore with a lantern and a coil of rope. What happened "
          "next was told in the village for years, and this is how the story went:")


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def run(cmd: list[str], env: dict) -> dict:
    """Run cmd: wall time, time to its first byte of stdout, peak RSS (MiB), stderr."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = p.stdout.read(1)
    t_first = time.perf_counter() - t0
    out = first + p.stdout.read()
    err = p.stderr.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return {"wall": wall, "first": t_first, "peak": usage.ru_maxrss / 1024, "stderr": err,
            "cpu": usage.ru_utime + usage.ru_stime,
            "stdout": out.decode("utf-8", "replace"), "load": load()}


def edgellm(model: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "edgellm", "generate", "-m", model, "--temp", "0", *args]


def compiles(r: dict) -> int:
    return sum(ln.startswith("edgellm: compiling kernels ") for ln in r["stderr"].splitlines())


def cold(a, env: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="edgellm-home-") as home:
        (Path(home) / "models").mkdir()
        model = str(Path(home) / "models" / Path(a.model).name)
        os.symlink(os.path.abspath(a.model), model)
        env = dict(env, EDGELLM_HOME=home)
        env.pop("NUMBA_CACHE_DIR", None)
        r = run(edgellm(model, "-n", "1", "-t", str(a.threads), "-p", "Hi"), env)
        print(f"cold  -t {a.threads}: first token {r['first']:.1f} s, wall {r['wall']:.1f} s, "
              f"cpu {r['cpu']:.1f} s, {compiles(r)} kernels compiled, peak {r['peak']:.0f} MiB "
              f"({r['load']})")
        for extra in (["-t", "1"], ["-t", str(a.threads), "--precise"]):
            r = run(edgellm(model, "-n", "1", *extra, "-p", "Hi"), env)
            print(f"then  {' '.join(extra)}: wall {r['wall']:.1f} s, {compiles(r)} kernels "
                  f"compiled ({r['load']})")


def warm(a, env: dict) -> None:
    numba_s, gen_s = [], []
    r = run(edgellm(a.model, "-n", "1", "-t", str(a.threads), "-p", "Hi"), env)  # fills the cache
    if compiles(r):
        print(f"(the kernel cache was cold: {compiles(r)} kernels compiled, {r['wall']:.0f} s)")
    for _ in range(a.rounds):
        numba_s.append(run([sys.executable, "-c", "import numba"], env)["wall"])
        r = run(edgellm(a.model, "-n", "1", "-t", str(a.threads), "-p", "Hi"), env)
        if compiles(r):
            raise SystemExit("a warm run compiled kernels")
        gen_s.append(r["wall"])
    n, g = statistics.median(numba_s), statistics.median(gen_s)
    print(f"warm  import numba {n:.2f} s, generate -n 1 {g:.2f} s: ratio {g / n:.1f} "
          f"(medians of {a.rounds}, {load()})")


def memory(a, env: dict) -> None:
    ours, theirs = [], []
    for _ in range(a.rounds):
        r = run(edgellm(a.model, "-n", "64", "-t", str(a.threads), "--ctx", "512",
                        "-p", PROMPT), env)
        ours.append(r["peak"])
        r = run([a.llama_bench, "-m", a.gguf, "-t", str(a.threads), "-p", "128", "-n", "64",
                 "-r", "1"], env)
        theirs.append(r["peak"])
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"peak  edgellm generate {o:.0f} MiB, llama-bench {t:.0f} MiB: +{o - t:.0f} MiB, "
          f"ratio {o / t:.2f} (medians of {a.rounds}, {load()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--llama-bench", default=LLAMA_BENCH)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-cold", action="store_true")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # as on a user's machine: Python writes (and the next start reads) edgellm's bytecode;
    # with PYTHONDONTWRITEBYTECODE set, every start compiles ~80 modules' source (~0.1 s)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        print("(PYTHONDONTWRITEBYTECODE unset for the runs, as Python's default)")
    if not a.skip_cold:
        cold(a, env)
    warm(a, env)
    memory(a, env)


if __name__ == "__main__":
    main()
