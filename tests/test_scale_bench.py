"""benchmarks/scale.py's own logic, cheaply: the environment its children get under --isa,
its memory-bound sum (the roofline) running, and the table naming each side's ISA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _avx2_host() -> bool:
    import llvmlite.binding as llb

    host = llb.get_host_cpu_features()
    return all(host.get(f) for f in ("avx2", "fma", "f16c"))


def _scale():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import scale
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return scale


@pytest.mark.skipif(not _avx2_host(), reason="this CPU cannot run AVX2 code")
def test_scale_benchmark_runs_its_roofline_under_an_isa(monkeypatch):
    """benchmarks/scale.py --isa: EDGELLM_ISA in its children, EDGELLM_PORTABLE and numba's
    CPU settings left to it (set here as a user might have), and its memory-bound sum runs."""
    scale = _scale()
    monkeypatch.setenv("EDGELLM_PORTABLE", "1")
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    probe = "import os; print(os.environ.get('EDGELLM_ISA'), os.environ.get('NUMBA_CPU_NAME'))"
    out, _ = scale.child([sys.executable, "-c", probe], scale.edgellm_env("avx2"))
    assert out.split() == ["avx2", "None"]
    roof = scale.run_roofline(1 << 20, 1, "avx2")
    assert roof["tok_s"] > 0 and roof["gb_s"] > 0


def test_scale_table_names_the_isa():
    scale = _scale()
    run = {"pp": 100.0, "tg": 50.0, "rss": 200.0}
    rows = {("360m", "q4_0", 1): {"llama.cpp": [run], "edgellm": [run],
                                  "roofline": [{"tok_s": 100.0, "gb_s": 20.0}],
                                  "load": [(1.0, 1.5)]}}
    text = scale.table(rows, {("360m", "q4_0"): 229e6}, "avx2 / avx2")
    head, _, row = text.splitlines()
    assert head.split(" | ")[1] == "ISA" and row.split(" | ")[1] == "avx2 / avx2"
    assert "1.00x / 1.00x" in row
