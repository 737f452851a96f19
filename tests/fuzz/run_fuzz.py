"""The big fuzz run: mutated files through edgellm's real entry points, each in a subprocess.

    python tests/fuzz/run_fuzz.py                      # 2,000 files per format, seed 0
    python tests/fuzz/run_fuzz.py --formats gguf --count 300 --seed 7 --keep /tmp/failures

Per format, every mutated file (tests/fuzz/mutate.py) goes through:
  packed       `edgellm info --verify FILE`; if the file opens, load_entry.py: `edgellm
               generate -m FILE ...` (loading, tokenizer, chat template, forward passes) and
               the API's load + logits()
  safetensors  `convert-model DIR OUT` (an HF directory: config, shards, index, tokenizer);
  gguf         `convert-model FILE OUT`; when a conversion succeeds, OUT goes through the
               packed steps too
each with a timeout (10 s; a run that times out is repeated once, and counts as a hang
only if it times out again), on a snapshot of the code taken at the start. Counted: signal
exits (crashes), timeouts (hangs), tracebacks, "internal error" lines (an exception edgellm
did not type), exit codes other than 0/1, error messages that are not one line or do not
name the file, files left behind by a failed conversion, and the peak memory of any one
process. Failing cases are kept (with their description and output) under --keep. Exits 1
if anything counted as a failure.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE.parent)]

from fuzz import mutate as M  # noqa: E402

PACKED_BASES = [("llama", "q4_0_mixed"), ("qwen3", "f32"), ("gemma3", "q8_0"), ("phi3", "q4_1"),
                ("qwen3-moe", "q4_0"), ("mixtral", "f16"), ("qwen2", "q4_1_mixed"),
                ("mistral-swa", "q8_0")]
HF_BASES = ["llama", "llama-bf16-sharded", "qwen3", "phi3", "mixtral", "gemma3", "qwen2"]
GGUF_BASES = ["llama", "qwen2", "qwen3"]
NOISE = ("edgellm: compiling", "edgellm: kernels compiled", "convert-model: warning:")
FAILURES = ("crash", "hang", "traceback", "internal error", "exit code", "multi-line message",
            "leftover files", "api: untyped", "api: no result", "stderr noise")


@dataclass
class Run:
    """One subprocess: exit code (negative: killed by that signal), output, time, memory."""

    cmd: list[str]
    rc: int
    timed_out: bool
    seconds: float
    max_rss_mb: float
    out: str
    err: str


# What the subprocesses run: a snapshot of the code taken at the start (main() sets it), so
# that edits made to the tree during a long run neither change nor recompile what is tested.
CODE = {"root": ROOT, "env": {}}


def snapshot(work: Path) -> None:
    """Copy edgellm/, converter/, models/ and load_entry.py under work/code; point CODE at it,
    with its own numba cache (compiled once by warm_up, removed with `work`)."""
    code = work / "code"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("edgellm", "converter", "models"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, code / name, ignore=ignore)
    (code / "tests" / "fuzz").mkdir(parents=True)
    shutil.copy(HERE / "load_entry.py", code / "tests" / "fuzz" / "load_entry.py")
    CODE["root"] = code
    CODE["env"] = {"NUMBA_CACHE_DIR": str(work / "numba-cache")}


def run(cmd: list[str], timeout: float, logdir: Path, tag: str) -> Run:
    env = dict(os.environ, PYTHONPATH=str(CODE["root"]), NUMBA_NUM_THREADS="1",
               PYTHONWARNINGS="ignore::DeprecationWarning", **CODE["env"])
    env.pop("EDGELLM_DEBUG", None)
    with open(logdir / f"{tag}.out", "w+b") as out, open(logdir / f"{tag}.err", "w+b") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                             cwd=logdir, start_new_session=True)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        _, status, usage = os.wait4(p.pid, 0)  # wait4: this process's own peak RSS
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return Run(cmd, p.returncode, timed_out.is_set(), seconds, usage.ru_maxrss / 1024,
                   out.read()[-20000:].decode("utf-8", "replace"),
                   err.read()[-20000:].decode("utf-8", "replace"))


def run_retrying(cmd: list[str], timeout: float, logdir: Path, tag: str,
                 counts: collections.Counter) -> Run:
    """run(), and once more if it timed out: a hang is a second timeout in a row. (A loaded
    machine can stretch a 2 s run past the limit; a kernel compiled for the first time in
    the run gets as long as it needs, then the run is repeated.)"""
    r = run(cmd, timeout, logdir, tag)
    if not r.timed_out:
        return r
    if "compiling kernels" in r.err:
        counts["timeouts: first compile of a kernel, repeated"] += 1
        run(cmd, 900, logdir, tag)
    else:
        counts["timeouts: repeated once"] += 1
    return run(cmd, timeout, logdir, tag)


def check(r: Run, stage: str, named: str, counts: collections.Counter) -> list[str]:
    """What is wrong with one run (see FAILURES); updates the informational counts."""
    bad = []
    if r.timed_out:
        return ["hang"]
    if r.rc < 0:
        bad.append(f"crash (signal {signal.Signals(-r.rc).name})")
    if "Traceback (most recent call last)" in r.err:
        bad.append("traceback")
    if "internal error:" in r.err:
        bad.append("internal error")
    if r.rc not in (0, 1) and r.rc >= 0:
        bad.append(f"exit code {r.rc}")
    lines = [ln for ln in r.err.splitlines() if ln.strip() and not ln.startswith(NOISE)]
    api = [ln for ln in lines if ln.startswith("FUZZ-API")]
    lines = [ln for ln in lines if not ln.startswith("FUZZ-API")]
    if stage == "load" and r.rc >= 0 and not bad:
        if not api:
            bad.append("api: no result")
        elif api[0].startswith("FUZZ-API typed"):
            counts["api: typed error"] += 1
    if r.rc == 1 and not bad:
        if stage == "info" and not lines and "CORRUPT" in r.out:
            counts["info: checksum mismatch found"] += 1
        elif len(lines) != 1 or ": error: " not in lines[0]:
            bad.append("multi-line message")
        elif named not in lines[0]:
            counts[f"{stage}: message does not name the file: {reason(r, named)}"] += 1
    if r.rc == 0 and lines and stage != "load":
        bad.append("stderr noise")
    return bad


def reason(r: Run, named: str) -> str:
    """A rejection's kind: its message without the path, numbers and quoted values."""
    lines = [ln for ln in r.err.splitlines() if ": error: " in ln]
    if not lines:
        return "(checksum)" if "CORRUPT" in r.out else "(none)"
    msg = lines[0].split(": error: ", 1)[1].replace(named, "FILE")
    msg = re.sub(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|-?\d[\d.e+-]*", "_", msg)
    msg = re.sub(r"model\.layers\._\.|tensor \S+", "tensor ", msg)
    return " ".join(msg.split()[:9])


@dataclass
class Stats:
    files: int = 0
    runs: int = 0
    accepted: int = 0
    rejected: int = 0
    converted_loaded: int = 0
    seconds: float = 0.0
    max_rss_mb: float = 0.0
    failures: collections.Counter = field(default_factory=collections.Counter)
    info: collections.Counter = field(default_factory=collections.Counter)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    slowest: float = 0.0

    def merge(self, o: Stats) -> None:
        """Add a case's counts (each worker thread counts into its own Stats)."""
        for k in ("runs", "accepted", "rejected", "converted_loaded"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        self.max_rss_mb = max(self.max_rss_mb, o.max_rss_mb)
        self.slowest = max(self.slowest, o.slowest)
        self.info.update(o.info)
        self.reasons.update(o.reasons)


def packed_steps(path: Path, logdir: Path, case: int, timeout: float, st: Stats,
                 tag: str = "") -> list[str]:
    """info --verify, then (if it opens) generate + API; returns the failures."""
    py = sys.executable
    r = run_retrying([py, "-m", "edgellm", "info", "--verify", str(path)], timeout, logdir,
                     tag + "info", st.info)
    runs = [("info", r)]
    opened = r.rc == 0 or (r.rc == 1 and "CORRUPT" in r.out)
    if opened:
        chat = ["--chat"] if case % 2 else []
        entry = CODE["root"] / "tests" / "fuzz" / "load_entry.py"
        runs.append(("load", run_retrying([py, str(entry), str(path), *chat], timeout, logdir,
                                          tag + "load", st.info)))
    bad = []
    for stage, r in runs:
        st.runs += 1
        st.max_rss_mb = max(st.max_rss_mb, r.max_rss_mb)
        st.slowest = max(st.slowest, r.seconds)
        bad += [f"{tag}{stage}: {b}" for b in check(r, stage, str(path), st.info)]
    last = runs[-1][1]
    if not bad:
        if last.rc == 0 and not (len(runs) == 2 and "FUZZ-API typed" in last.err):
            st.accepted += 1
        else:
            st.rejected += 1
            st.reasons[tag + reason(last, str(path))] += 1
    return bad


def convert_steps(src: Path, logdir: Path, case: int, timeout: float, st: Stats) -> list[str]:
    out = logdir / "out.edgellm"
    r = run_retrying([sys.executable, "-m", "converter", str(src), str(out), "-q"], timeout,
                     logdir, "convert", st.info)
    st.runs += 1
    st.max_rss_mb = max(st.max_rss_mb, r.max_rss_mb)
    st.slowest = max(st.slowest, r.seconds)
    bad = [f"convert: {b}" for b in check(r, "convert", str(src), st.info)]
    if r.rc != 0:
        left = [p.name for p in logdir.iterdir() if p.name.startswith((".out.edgellm",
                                                                       "out.edgellm"))]
        if left:
            bad.append(f"leftover files {left}")
        if not bad:
            st.rejected += 1
            st.reasons[reason(r, str(src))] += 1
        return bad
    st.converted_loaded += 1
    return bad + packed_steps(out, logdir, case, timeout, st, tag="converted ")


def make_bases(fmt_name: str, work: Path):
    if fmt_name == "packed":
        from converter.hf_source import open_hf
        from converter.pack import convert

        bases = {}
        for name, quant in PACKED_BASES:
            out = work / f"base-{name}-{quant}.edgellm"
            convert(open_hf(M.TINY / name), out, quant, progress=False)
            bases[f"{name}-{quant}"] = out.read_bytes()
        return bases
    if fmt_name == "safetensors":
        return {name: M.read_dir(M.TINY / name) for name in HF_BASES}
    return {name: M.GGUFBase.make(name, work) for name in GGUF_BASES}


def make_case(fmt_name: str, bases, i: int, seed: int, casedir: Path) -> tuple[str, Path]:
    rng = random.Random(f"{seed}-{fmt_name}-{i}")
    base = rng.choice(sorted(bases))
    casedir.mkdir(parents=True)
    if fmt_name == "packed":
        desc, raw = M.mutate_packed(rng, bases[base])
        path = casedir / "model.edgellm"
        path.write_bytes(raw)
    elif fmt_name == "safetensors":
        desc, files = M.mutate_safetensors(rng, bases[base])
        path = M.write_dir(files, casedir / "hf")
    else:
        desc, raw = M.mutate_gguf(rng, bases[base], casedir)
        path = casedir / "model.gguf"
        path.write_bytes(raw)
    return f"{base}: {desc}", path


def warm_up(work: Path, timeout: float) -> None:
    """Compile (or load) every kernel once, so that no case pays for compilation."""
    entry = CODE["root"] / "tests" / "fuzz" / "load_entry.py"
    for p in sorted(work.glob("base-*.edgellm")):
        r = run([sys.executable, str(entry), str(p), "--chat"], 900, work, "warmup")
        if r.rc != 0 or "FUZZ-API ok" not in r.err:
            sys.exit(f"warm-up failed on {p.name}: {r.err[-2000:]}")


def fuzz(fmt_name: str, count: int, seed: int, jobs: int, timeout: float, work: Path,
         keep: Path | None, verbose: bool) -> Stats:
    st = Stats()
    bases = make_bases(fmt_name, work)
    t0 = time.monotonic()

    def one(i: int) -> tuple[int, str, list[str], Path, Stats]:
        casedir = work / f"{fmt_name}-{i}"
        desc, path = make_case(fmt_name, bases, i, seed, casedir)
        steps = packed_steps if fmt_name == "packed" else convert_steps
        mine = Stats()
        return i, desc, steps(path, casedir, i, timeout, mine), casedir, mine

    with ThreadPoolExecutor(jobs) as pool:
        pending, nxt = set(), 0
        while nxt < count or pending:
            while nxt < count and len(pending) < 2 * jobs:
                pending.add(pool.submit(one, nxt))
                nxt += 1
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i, desc, bad, casedir, mine = fut.result()
                st.merge(mine)
                st.files += 1
                for b in bad:
                    st.failures[re.sub(r" \[.*", "", b)] += 1
                if bad:
                    print(f"FAIL {fmt_name} #{i} ({desc}): {'; '.join(bad)}", flush=True)
                    if keep is not None:
                        dest = keep / casedir.name
                        shutil.rmtree(dest, ignore_errors=True)
                        shutil.copytree(casedir, dest)
                        (dest / "description.txt").write_text(f"seed {seed} case {i}: {desc}\n"
                                                               + "\n".join(bad) + "\n")
                elif verbose:
                    print(f"ok {fmt_name} #{i} ({desc})", flush=True)
                shutil.rmtree(casedir, ignore_errors=True)
                if st.files % 100 == 0:
                    print(f"{fmt_name}: {st.files}/{count} files, "
                          f"{sum(st.failures.values())} failures, "
                          f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    st.seconds = time.monotonic() - t0
    return st


def report(fmt_name: str, st: Stats) -> dict:
    crashes = sum(n for k, n in st.failures.items() if "crash" in k)
    hangs = sum(n for k, n in st.failures.items() if "hang" in k)
    tracebacks = sum(n for k, n in st.failures.items() if "traceback" in k)
    print(f"\n== {fmt_name}: {st.files} mutated files, {st.runs} subprocess runs, "
          f"{st.seconds:.0f} s")
    print(f"   crashes (signal exits) {crashes}, hangs (> timeout) {hangs}, "
          f"tracebacks {tracebacks}, all failures {sum(st.failures.values())}")
    print(f"   accepted {st.accepted}, rejected with a typed one-line error {st.rejected}"
          + (f", converted and then loaded {st.converted_loaded}" if st.converted_loaded else ""))
    print(f"   slowest process {st.slowest:.1f} s, largest peak RSS {st.max_rss_mb:.0f} MB")
    for k, n in sorted(st.failures.items()):
        print(f"   FAILURE {k}: {n}")
    for k, n in sorted(st.info.items()):
        print(f"   note: {k}: {n}")
    print("   most common rejections:")
    for k, n in st.reasons.most_common(12):
        print(f"     {n:5d}  {k}")
    return {"files": st.files, "runs": st.runs, "crashes": crashes, "hangs": hangs,
            "tracebacks": tracebacks, "failures": dict(st.failures), "notes": dict(st.info),
            "accepted": st.accepted, "rejected": st.rejected,
            "converted_loaded": st.converted_loaded, "seconds": round(st.seconds, 1),
            "slowest_s": round(st.slowest, 2), "max_rss_mb": round(st.max_rss_mb),
            "rejections": dict(st.reasons.most_common(30))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="packed,safetensors,gguf")
    ap.add_argument("--count", type=int, default=2000, help="mutated files per format")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per process")
    ap.add_argument("--keep", type=Path, default=None, help="copy failing cases here")
    ap.add_argument("--json", type=Path, default=None, help="write the counts here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    ap.add_argument("--live", action="store_true",
                    help="run the working tree as it changes, not a snapshot taken at start")
    args = ap.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="edgellm-fuzz-"))
    results = {}
    try:
        if not args.live:
            snapshot(work)
        make_bases("packed", work)
        t0 = time.monotonic()
        warm_up(work, args.timeout)
        print(f"kernels warmed up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        for name in args.formats.split(","):
            st = fuzz(name, args.count, args.seed, args.jobs, args.timeout, work, args.keep,
                      args.verbose)
            results[name] = report(name, st)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "timeout_s": args.timeout,
                                         "formats": results}, indent=1))
    return 1 if any(r["failures"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
