#!/usr/bin/env python3
"""Generate under a memory cap; compare with an uncapped run and with `edgellm info`.

    python scripts/memory-cap.py [MODEL] [--limit 512M[,320M...]] [--tokens 64] [--ctx N]
        [--prompt-tokens N] [--threads T] [--repeat R] [--cold] [--no-uncapped] [--shared]

Each run is a fresh process in a child memory cgroup of its own (v1:
memory.limit_in_bytes; v2: memory.max), with the limit or none, and reports the cgroup's
peak (anonymous memory, shared memory and the page cache it brought in), the process's
VmHWM (its peak resident set: what `edgellm info` predicts), whether the OOM killer fired,
and prefill and decode tokens/s. Page cache is charged to the cgroup that first touches a
page, so the runs use a private copy of Python, the packages a run imports and the model
(see PrivateRuntime; --shared: the machine's own), and before each run the model, those
files and the kernel cache are written back and dropped from the page cache
(posix_fadvise DONTNEED): otherwise the figure is too good. A warm-up run first (not
reported) compiles any kernel the cache lacks; --cold gives each run an empty kernel cache
instead: the first run on a machine, which compiles every kernel. The capped and uncapped
runs alternate, --repeat times (medians at the end). Last, `edgellm info MODEL --ctx N
--json` is set against the uncapped peaks: for that, fill the context (--prompt-tokens +
--tokens = --ctx).

The weights are mapped from the file: clean pages that the kernel drops under the cap and
reads again when needed. A run under a tight cap that ends without an OOM kill, and its
tokens/s against the uncapped run's, show what that costs.

MODEL defaults to the default model (pulled if missing). Needs root (cgroups). Prints one
JSON object per run and a summary; exits 1 if a run failed or was OOM-killed. `--child`
is internal: the generation itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup")


# --- cgroups ---------------------------------------------------------------------------
def _v2() -> bool:
    return (CGROUP / "cgroup.controllers").exists()


def _own_group() -> Path:
    """Our memory cgroup's directory (v1: the memory hierarchy; v2: the unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if _v2() and hid == "0":
            return CGROUP / path.lstrip("/")
        if not _v2() and "memory" in ctrls.split(","):
            return CGROUP / "memory" / path.lstrip("/")
    raise SystemExit("memory-cap: no memory cgroup found (is the memory controller mounted?)")


class Cgroup:
    """A child memory cgroup with an optional limit; remove() after the run."""

    def __init__(self, limit: int | None):
        parent = _own_group()
        self.path = parent / f"edgellm_cap_{os.getpid()}_{time.monotonic_ns()}"
        self.path.mkdir()
        if limit is not None:
            if _v2():
                (self.path / "memory.max").write_text(str(limit))
                _try_write(self.path / "memory.swap.max", "0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
                _try_write(self.path / "memory.memsw.limit_in_bytes", str(limit))

    def enter_fn(self):
        """A preexec_fn that moves the child into this cgroup before it execs."""
        procs = self.path / "cgroup.procs"
        return lambda: procs.write_text(str(os.getpid()))

    def stats(self) -> dict:
        p = self.path
        if _v2():
            events = dict(line.split() for line in (p / "memory.events").read_text().splitlines())
            peak = p / "memory.peak"
            return {"peak": int(peak.read_text()) if peak.exists() else None,
                    "failcnt": int(events.get("max", 0)),
                    "oom_kill": int(events.get("oom_kill", 0))}
        oom = dict(line.split() for line in (p / "memory.oom_control").read_text().splitlines())
        return {"peak": int((p / "memory.max_usage_in_bytes").read_text()),
                "failcnt": int((p / "memory.failcnt").read_text()),
                "oom_kill": int(oom.get("oom_kill", 0))}

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:  # the last task is still leaving
                time.sleep(0.1)


def _try_write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass


def evict(path: Path) -> None:
    """Write back and drop `path`'s pages from the page cache."""
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


# --- the generation (in the child) -----------------------------------------------------
def _status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(args) -> int:
    t0 = time.perf_counter()
    sys.path.insert(0, str(REPO))  # the work tree this script belongs to
    import edgellm

    stages = {"import": _status()}
    with edgellm.load(args.model, threads=args.threads, context=args.ctx) as llm:
        stages["load"] = _status()
        from edgellm.kernels.warmup import release_compiler_pages

        tok = llm.tokenizer  # as the CLI's open_model: the tokenizer, then the kernels
        llm.model.warmup(release_compiler_pages)  # loads (or compiles) every kernel
        stages["warm"] = _status()
        load_s = time.perf_counter() - t0
        if args.prompt_tokens:  # a long prompt: a text repeated, cut to the length
            text = (REPO / "README.md").read_text("utf-8")
            ids = tok.encode(text, add_special_tokens=False)
            while len(ids) < args.prompt_tokens:
                ids = ids + ids
            ids = ids[:args.prompt_tokens]
        else:
            ids = llm.encode_prompt([{"role": "user", "content": "Tell me a story."}])
        no_eos = {int(e): -1e9 for e in tok.eos_ids}  # generate exactly --tokens
        last = list(llm.stream(ids, max_tokens=args.tokens, temperature=0, logit_bias=no_eos,
                               shift=False))[-1]
        stages["done"] = _status()
        st = last.stats
    print(json.dumps({"load_s": load_s, "prompt_tokens": st.prompt_tokens,
                      "generated_tokens": st.generated_tokens,
                      "prefill_tok_s": st.prefill_tok_s, "decode_tok_s": st.decode_tok_s,
                      "vm_hwm": stages["done"]["VmHWM"], "stages": stages,
                      "python": sys.prefix, "packages": _site_packages_used()}))
    return 0


def _site_packages_used() -> list[str]:
    """The entries of site-packages (packages, modules) that this process imported."""
    sites = {Path(p).resolve() for p in (sysconfig.get_paths()["purelib"],
                                         sysconfig.get_paths()["platlib"])}
    names = set()
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)
        if not f:
            continue
        f = Path(f).resolve()
        names.update(f.relative_to(s).parts[0] for s in sites if s in f.parents)
    return sorted(names)


# --- a private copy of the runtime (--private) -------------------------------------------
class PrivateRuntime:
    """Python, its standard library and the packages a run imports, copied to a directory
    of their own (on disk) and evicted from the page cache.

    A cgroup is charged for a file page only if it is the first to touch it. The shared
    libraries of Python, numpy, numba and llvmlite that other processes on the machine
    have mapped (other Python jobs) are charged to their cgroups, and so is a model file
    that another process maps: the cgroup's peak then leaves them out (~100 MiB on a busy
    machine). Private copies are touched first by the run itself, as on a board that runs
    nothing else, so its cgroup peak counts everything it holds. Remove with cleanup()."""

    def __init__(self, packages: list[str], model: Path):
        ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        self.dir = Path(tempfile.mkdtemp(prefix="edgellm-private-", dir="/var/tmp"))
        try:
            stdlib = Path(sysconfig.get_paths()["stdlib"])
            site = Path(sysconfig.get_paths()["purelib"])
            lib = self.dir / "lib"
            shutil.copytree(stdlib, lib / ver, ignore=shutil.ignore_patterns(
                "site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"))
            (self.dir / "bin").mkdir()
            self.python = self.dir / "bin" / ver
            shutil.copy2(Path(sys.executable).resolve(), self.python)
            libpython = sysconfig.get_config_var("INSTSONAME")
            libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
            if sysconfig.get_config_var("Py_ENABLE_SHARED") and (libdir / libpython).exists():
                shutil.copy2((libdir / libpython).resolve(), lib / libpython)
            dest = lib / ver / "site-packages"
            dest.mkdir()
            extra = [f"{n}.libs" for n in packages] + [p.name for p in site.glob("*.dist-info")]
            for name in packages + extra:
                src = site / name
                if src.is_dir():
                    shutil.copytree(src, dest / name)
                elif src.is_file():
                    shutil.copy2(src, dest / name)
            self.model = self.dir / model.name
            shutil.copy2(model, self.model)
            os.sync()
            evict_tree(self.dir)
        except BaseException:
            self.cleanup()
            raise
        self.env = {"LD_LIBRARY_PATH": str(lib), "PYTHONNOUSERSITE": "1"}

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# --- the runs (in the parent) ----------------------------------------------------------
def runtime_files() -> list[Path]:
    """What a run reads besides the model: Python, the packages edgellm imports and the
    kernel cache. Evicted too (--evict-runtime) so that the cgroup is charged for them."""
    import importlib.util
    import sysconfig

    paths = {Path(sysconfig.get_paths()["stdlib"]), Path(sys.executable).resolve()}
    for name in ("numpy", "numba", "llvmlite", "tokenizers", "jinja2", "safetensors"):
        spec = importlib.util.find_spec(name)
        if spec and spec.submodule_search_locations:
            paths.update(Path(p) for p in spec.submodule_search_locations)
            libs = Path(next(iter(spec.submodule_search_locations))).parent / f"{name}.libs"
            if libs.is_dir():
                paths.add(libs)
    sys.path.insert(0, str(REPO))
    from edgellm.runtime import numba_setup

    paths.add(Path(numba_setup.CACHE_DIR))
    return sorted(paths)


def evict_tree(root: Path) -> None:
    files = [root] if root.is_file() else (Path(d) / f for d, _, fs in os.walk(root) for f in fs)
    for f in files:
        try:
            evict(f)
        except OSError:
            pass


def run_one(args, limit: int | None, cache_dir: str | None,
            private: PrivateRuntime | None = None) -> dict:
    model = private.model if private else args.model
    os.sync()
    evict(model)
    if args.evict_runtime:
        for path in runtime_files() + ([private.dir] if private else []):
            evict_tree(path)
    cg = Cgroup(limit)
    python = private.python if private else sys.executable
    cmd = [str(python), str(Path(__file__).resolve()), "--child", str(model),
           "--tokens", str(args.tokens), "--prompt-tokens", str(args.prompt_tokens)]
    if args.ctx:
        cmd += ["--ctx", str(args.ctx)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, **(private.env if private else {}))
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
    try:
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cg.enter_fn(),
                              cwd=REPO, env=env)
        wall = time.perf_counter() - start
        result = {"limit": limit, "returncode": proc.returncode, "wall_s": wall, **cg.stats()}
    finally:
        cg.remove()
    if proc.returncode == 0:
        result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    else:
        result["stderr"] = proc.stderr[-2000:]
    return result


def predicted(model: Path, ctx: int | None) -> dict:
    cmd = [sys.executable, "-m", "edgellm", "info", str(model), "--json"]
    if ctx:
        cmd += ["--ctx", str(ctx)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout)["memory"]


def default_model() -> Path:
    sys.path.insert(0, str(REPO))
    from edgellm.pull import resolve

    return Path(resolve(None, say=lambda m: print(m, file=sys.stderr)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="model file (default: the default)")
    ap.add_argument("--limit", default="512M",
                    help="memory cap(s), comma-separated (e.g. 512M or 512M,320M)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    ap.add_argument("--ctx", type=int, default=None, help="context (default: the model's)")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="a prompt of this many tokens (default: a short chat prompt)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-uncapped", action="store_true", help="skip the uncapped run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the capped and uncapped runs this many times, alternating")
    ap.add_argument("--cold", action="store_true",
                    help="start each run with an empty kernel cache (the first run on a "
                         "machine: every kernel is compiled)")
    ap.add_argument("--no-evict-runtime", dest="evict_runtime", action="store_false",
                    help="evict only the model file, not Python's and the packages' files")
    ap.add_argument("--shared", action="store_true",
                    help="run the machine's Python and packages and the model file itself "
                         "instead of private copies (the cgroup's peak then leaves out what "
                         "other processes have mapped)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if os.geteuid() != 0:
        raise SystemExit("memory-cap: needs root (creates a memory cgroup)")
    args.model = Path(args.model) if args.model else default_model()
    limits = [parse_size(t) for t in args.limit.split(",") if t.strip()]
    if not args.no_uncapped:
        limits.append(None)
    # a warm-up run (not reported): compiles any kernel the cache lacks, and lists the
    # packages a run imports for the private copy
    warm = run_one(argparse.Namespace(**{**vars(args), "prompt_tokens": 0, "tokens": 4}),
                   None, None)
    if warm["returncode"] != 0:
        print(f"memory-cap: the warm-up run failed:\n{warm.get('stderr', '')}", file=sys.stderr)
        return 1
    private = None if args.shared else PrivateRuntime(warm["packages"], args.model)
    runs = []
    try:
        for rep in range(args.repeat):
            for limit in (limits if rep % 2 == 0 else limits[::-1]):  # alternate the order
                with tempfile.TemporaryDirectory(prefix="edgellm-cold-cache-") as tmp:
                    r = run_one(args, limit, tmp if args.cold else None, private)
                r["run"] = f"limit {limit // 2**20}M" if limit else "uncapped"
                print(json.dumps(r), flush=True)
                runs.append(r)
    finally:
        if private:
            private.cleanup()
    plan = predicted(args.model, args.ctx)
    mib = 2**20
    print(f"\nmodel {args.model} ({args.model.stat().st_size / mib:.1f} MiB), "
          f"ctx {plan['context']}, prompt {args.prompt_tokens or 'chat'} tokens, "
          f"{args.tokens} generated, threads {args.threads or 'all'}"
          f"{', cold kernel cache' if args.cold else ''}"
          f"{', shared runtime' if args.shared else ', private copy of the runtime and model'}")
    for r in runs:
        if r["returncode"] != 0:
            print(f"  {r['run']:12s} FAILED rc={r['returncode']} oom_kill={r['oom_kill']} "
                  f"peak {r['peak'] / mib:.0f} MiB\n{r.get('stderr', '')}")
            continue
        print(f"  {r['run']:12s} cgroup peak {r['peak'] / mib:4.0f} MiB, VmHWM "
              f"{r['vm_hwm'] / mib:4.0f} MiB, oom_kill {r['oom_kill']}, failcnt "
              f"{r['failcnt']:6d}; prefill {r['prefill_tok_s']:6.1f} tok/s, decode "
              f"{r['decode_tok_s']:6.1f} tok/s ({r['generated_tokens']} tokens), "
              f"wall {r['wall_s']:.1f} s")
    parts = ", ".join(f"{k} {plan[k] / mib:.1f}" for k in
                      ("weights", "kv_cache", "buffers", "tokenizer", "baseline") if k in plan)
    print(f"  edgellm info --ctx {plan['context']}: {plan['total'] / mib:.0f} MiB ({parts})")
    held = args.prompt_tokens + args.tokens if args.prompt_tokens else None
    if held is None or held < 0.9 * plan["context"]:
        print(f"    (the KV cache held only part of the context: for a like-for-like "
              f"figure, fill it with --prompt-tokens; the plan at 256 tokens is "
              f"{predicted(args.model, 256)['total'] / mib:.0f} MiB)")
    for r in runs:
        if r["returncode"] == 0 and r["limit"] is None:
            for what in ("peak", "vm_hwm"):
                print(f"    vs uncapped {'cgroup peak' if what == 'peak' else 'VmHWM'} "
                      f"{r[what] / mib:.0f} MiB: {plan['total'] / r[what] - 1:+.1%}")
    if args.repeat > 1:
        import statistics

        print("  medians:")
        for limit in limits:
            name = f"limit {limit // 2**20}M" if limit else "uncapped"
            done = [r for r in runs if r["run"] == name and r["returncode"] == 0]
            if done:
                med = {k: statistics.median(r[k] for r in done)
                       for k in ("peak", "vm_hwm", "prefill_tok_s", "decode_tok_s")}
                print(f"  {name:12s} cgroup peak {med['peak'] / mib:4.0f} MiB, VmHWM "
                      f"{med['vm_hwm'] / mib:4.0f} MiB; prefill {med['prefill_tok_s']:6.1f} "
                      f"tok/s, decode {med['decode_tok_s']:6.1f} tok/s ({len(done)} runs)")
    ok = all(r["returncode"] == 0 and not r["oom_kill"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
