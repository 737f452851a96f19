"""The first run on a machine: the decode step compiles in a second process.

On an empty kernel cache the fused decode step is the largest compile (its worker, then
the parallel region, each optimizing again the kernels it links in), and the first generated token does not need it: that token comes from the
prompt's prefill. Where the machine has a second core and memory to spare, the CLI's
generate has child processes (`python -m edgellm.commands.first_run SPEC`) compile into
the same kernel cache while it compiles the prefill and answers:

  child 1  the step's form for this thread count ("decode"), then the other form (serial or
           parallel) and the prefill's one-row kernels of the other thread count
           ("variants"), so another -t compiles nothing
  child 2  the other precision's prefill ("precision"), so --precise (or its absence)
           compiles nothing; started once this process's own prefill has compiled

The step's first run waits for child 1's "decode" line (FusedDecoder.ready), then loads the
step from the cache; the command waits for both children before it exits. A child that
fails is reported and its work done here, as without a second process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

MIN_AVAILABLE = 1 << 30  # bytes of MemAvailable a child's compile may use (it peaks ~0.4 GB)


def worth_it() -> bool:
    """A second core to compile on, and memory for a second compiler."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if cores < 2:
        return False
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 >= MIN_AVAILABLE
    except (OSError, ValueError, IndexError):
        pass
    return True  # no /proc (macOS): assume a laptop's memory


class Background:
    """Child processes compiling this model's kernels into the shared kernel cache.

    spec: what the children open, as the CLI opened it: path, threads, context, precise,
    kv_type, act_type, lora ([[dir, scale], ...] or None), fused_env (EDGELLM_FUSED's value)."""

    def __init__(self, spec: dict, say):
        self.spec, self.say = spec, say
        self.children: list[tuple[subprocess.Popen, list[str], set[str]]] = []
        self.errors: dict[int, object] = {}  # pid -> the child's stderr (a temporary file)
        self.t0 = time.perf_counter()

    def start(self, jobs: list[str]) -> None:
        """A child that runs `jobs` in order, printing each one's name when it is done."""
        spec = json.dumps(dict(self.spec, jobs=jobs))
        err = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: never fills up
        proc = subprocess.Popen([sys.executable, "-m", "edgellm.commands.first_run", spec],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                text=True)
        self.errors[proc.pid] = err
        self.children.append((proc, jobs, set()))

    def wait_for(self, job: str) -> bool:
        """Block until the child running `job` says it is done (True), or has exited
        without doing it (False: reported; the caller compiles it itself)."""
        for proc, jobs, done in self.children:
            if job not in jobs:
                continue
            while job not in done:
                line = proc.stdout.readline()
                if not line:
                    self._failed(proc, job)
                    return False
                done.add(line.strip())
            return True
        return False

    def decode_ready(self) -> None:
        """FusedDecoder.ready: wait until the step's kernel is in the cache."""
        if not self._done("decode"):
            self.say("edgellm: waiting for the decode step's kernels (compiling in a second "
                     "process, first run only)...")
        if self.wait_for("decode"):
            self.say(f"edgellm: decode step compiled ({time.perf_counter() - self.t0:.1f} s "
                     "since the start)")

    def finish(self) -> None:
        """Wait for every child to finish its jobs (a later run then compiles nothing)."""
        pending = [job for proc, jobs, done in self.children for job in jobs
                   if job not in done and proc.poll() is None]
        if pending:
            self.say("edgellm: finishing the first run's kernels in the background...")
        for _, jobs, _ in self.children:
            for job in jobs:
                self.wait_for(job)
        for proc, _, _ in self.children:
            proc.wait()
            proc.stdout.close()
            self.errors.pop(proc.pid).close()
        self.children.clear()

    def _done(self, job: str) -> bool:
        return any(job in done for _, _, done in self.children)

    def _failed(self, proc: subprocess.Popen, job: str) -> None:
        code = proc.wait()
        err = self.errors[proc.pid]
        err.seek(0)
        lines = err.read().strip().splitlines()
        why = lines[-1] if lines else f"exit code {code}"
        self.say(f"edgellm: the background compile of {job!r} failed ({why}); compiling "
                 "here instead")


def _run(spec: dict) -> None:
    """The child: open the model as the CLI did and run the jobs."""
    if spec.get("fused_env") is not None:
        os.environ["EDGELLM_FUSED"] = spec["fused_env"]
    from ..llm import LLM
    from .decode_path import fused_default

    lora = [tuple(x) for x in spec["lora"]] if spec.get("lora") else None
    with LLM(spec["path"], threads=spec["threads"], context=spec["context"],
             precise=spec["precise"], kv_type=spec["kv_type"], fused=fused_default(),
             lora=lora, act_type=spec.get("act_type", "int16")) as llm:
        model = llm.model
        for job in spec["jobs"]:
            if job == "decode":
                model.fused.load()
            elif job == "variants":
                model.reset()
                model.fused.warm_variants()
                model.warm_other_threads()
            elif job == "precision":
                model.warm_other_precision()
            else:
                raise ValueError(f"unknown job {job!r}")
            model.reset()
            print(job, flush=True)


if __name__ == "__main__":
    _run(json.loads(sys.argv[1]))
