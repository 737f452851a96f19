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
phases (--phases, instead of the above) where a cold (fresh kernel cache) and then a warm
       `edgellm generate -n 1` spend their time, traced in the process: imports, opening
       the file, building the model, each kernel numba compiles (with its nested
       compiles' count) or loads from the cache, the warmup, the first token; wall and
       CPU seconds of each (on a shared machine the CPU column is the one to read), and
       the CPU time of the first run's child processes.
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


def _trace(argv: list[str]) -> None:
    """In this process: run `edgellm ARGV` and print its phases (see --phases)."""
    import resource

    t0, c0 = time.perf_counter(), time.process_time()
    rows: list[tuple] = []  # (kind, name, at, cpu at, took, cpu took, nested compiles)

    def now() -> tuple[float, float]:
        return time.perf_counter() - t0, time.process_time() - c0

    def mark(name: str) -> None:
        rows.append(("mark", name, *now(), 0.0, 0.0, 0))

    def span(obj, attr: str, label: str) -> None:
        f = getattr(obj, attr)

        def timed(*a, **k):
            (w, c) = now()
            try:
                return f(*a, **k)
            finally:
                w1, c1 = now()
                rows.append(("span", label, w, c, w1 - w, c1 - c, 0))
        setattr(obj, attr, timed)

    import numba  # noqa: F401  (timed: numba's import)
    mark("import numba")
    from numba.core import caching, event

    from edgellm import cli, loader
    from edgellm.arch import base
    from edgellm.commands import common
    from edgellm.kernels import jit  # noqa: F401  (its cache-load changes installed first)
    from edgellm.modelfile import format as fmt
    from edgellm.step import fused
    mark("import edgellm")
    load = caching.Cache.load_overload

    def load_overload(self, sig, ctx):
        w, c = now()
        r = load(self, sig, ctx)
        w1, c1 = now()
        if r is not None:
            rows.append(("load", self._name.split(" ")[1], w, c, w1 - w, c1 - c, 0))
        return r
    caching.Cache.load_overload = load_overload

    class Compiles(event.Listener):
        depth, nested, start = 0, 0, (0.0, 0.0)

        def on_start(self, ev):
            self.depth += 1
            if self.depth == 1:
                self.nested, self.start = 0, now()
            else:
                self.nested += 1

        def on_end(self, ev):
            self.depth -= 1
            if self.depth == 0:
                w1, c1 = now()
                (w, c) = self.start
                rows.append(("compile", ev.data["dispatcher"].py_func.__name__, w, c,
                             w1 - w, c1 - c, self.nested))
    event.register("numba:compile", Compiles())
    span(fmt.PackedModel, "__init__", "open the file")
    span(loader, "build", "build the model")
    span(fused.FusedDecoder, "load", "load the decode step")
    span(base.Transformer, "warm_chunk", "warm a chunk")
    span(base.Transformer, "warmup", "warmup (all of it)")
    span(base.Transformer, "forward", "forward (first token)")
    span(common, "finish_first_run", "finish the first run")
    out = sys.stdout

    class First:
        def write(self, text):
            if text and not any(r[1] == "first output" for r in rows):
                mark("first output")
            return out.write(text)

        def __getattr__(self, name):
            return getattr(out, name)

    sys.stdout = First()
    try:
        cli.main(argv)
    finally:
        sys.stdout = out
        mark("exit")
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        loads = [r for r in rows if r[0] == "load"]
        for kind, name, w, c, dw, dc, nested in rows:
            if kind == "load" and dw < 0.05:
                continue
            more = f" (+{nested} nested)" if nested else ""
            took = f"{dw:6.2f} s (cpu {dc:5.2f})" if kind != "mark" else " " * 20
            print(f"  {kind:8s} {(name + more)[:44]:44s} at {w:6.2f} (cpu {c:6.2f})  {took}",
                  file=sys.stderr)
        print(f"  cache loads: {len(loads)}, {sum(r[4] for r in loads):.2f} s (cpu "
              f"{sum(r[5] for r in loads):.2f}); child processes' cpu "
              f"{kids.ru_utime + kids.ru_stime:.1f} s", file=sys.stderr)


def phases(a, env: dict) -> None:
    """A cold then a warm `generate -n 1`, each traced (_trace) in a child process."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trace-child", "generate", "-m",
           a.model, "-p", a.prompt, "-n", "1", "-t", str(a.threads), "--temp", "0"]
    with tempfile.TemporaryDirectory(prefix="edgellm-home-") as home:
        env = dict(env, EDGELLM_HOME=home)
        env.pop("NUMBA_CACHE_DIR", None)
        for name in ("cold", "warm"):
            print(f"{name} -t {a.threads} ({load()}):", flush=True)
            r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
            print("\n".join(ln for ln in r.stderr.splitlines() if ln.startswith("  ")))
            if r.returncode:
                raise SystemExit(f"failed ({r.returncode}):\n{r.stderr[-2000:]}")
        print(f"({load()})")


def main() -> None:
    if sys.argv[1:2] == ["--trace-child"]:
        _trace(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--llama-bench", default=LLAMA_BENCH)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--phases", action="store_true",
                    help="trace a cold and a warm first token's phases instead")
    ap.add_argument("--prompt", default="Hello", help="the prompt of --phases")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # as on a user's machine: Python writes (and the next start reads) edgellm's bytecode;
    # with PYTHONDONTWRITEBYTECODE set, every start compiles ~80 modules' source (~0.1 s)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        print("(PYTHONDONTWRITEBYTECODE unset for the runs, as Python's default)")
    if a.phases:
        phases(a, env)
        return
    if not a.skip_cold:
        cold(a, env)
    warm(a, env)
    memory(a, env)


if __name__ == "__main__":
    main()
