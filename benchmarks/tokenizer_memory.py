"""What a model file's tokenizer costs in memory: opening the file, then building it.

    python benchmarks/tokenizer_memory.py MODEL.edgellm [MODEL2 ...]

Each file in a fresh process: anonymous memory (/proc/self/smaps_rollup) and the peak
resident set (VmHWM) before and after PackedModel() and Tokenizer.from_packed(), the
build's time, and the memory plan's tokenizer term. Prints one JSON object per file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def _mib(field: str, path: str) -> float:
    with open(path) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def _now() -> dict:
    return {"anon": _mib("Anonymous:", "/proc/self/smaps_rollup"),
            "hwm": _mib("VmHWM:", "/proc/self/status")}


def child(path: str) -> dict:
    from edgellm import memory_plan
    from edgellm.modelfile.format import PackedModel
    from edgellm.text.tokenizer import Tokenizer

    start = _now()
    packed = PackedModel(path)
    opened = _now()
    t = time.perf_counter()
    tok = Tokenizer.from_packed(packed)
    seconds = time.perf_counter() - t
    built = _now()
    return {"file": path, "version": packed.version,
            "stored": (packed.tokenizer_stored or {}).get("kind", "header json"),
            "vocab": tok.vocab_size,
            "open_mib": round(opened["anon"] - start["anon"], 1),
            "build_mib": round(built["anon"] - opened["anon"], 1),
            "build_peak_mib": round(built["hwm"] - opened["hwm"], 1),
            "build_s": round(seconds, 2),
            "plan_mib": round(memory_plan.tokenizer_bytes(packed) / 2**20, 1)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1])))
        return 0
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for path in argv:
        r = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True,
                           text=True)
        print(r.stdout.strip() or f"{path}: {r.stderr.strip().splitlines()[-1:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
