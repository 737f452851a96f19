"""EDGELLM_ISA (runtime/numba_setup.py): the instruction set the kernels are built for.

EDGELLM_ISA=avx2 must make this process run what an AVX2 machine without AVX-512 (Haswell,
Zen 1-3) runs, whatever CPU the tests run on: the portable path, and numba compiling for
Haswell, so LLVM emits no AVX-512 (no zmm register, no mask register) even on an AVX-512
host, into a cache of its own. Checked in a subprocess (the ISA is fixed when numba first
compiles): freshly compiled decode kernels' assembly, numba's code generator's features,
and the fused step's logits on the tiny llama (q4_0, x16 layout) against the portable
path's on this CPU, within test_layout.py's tolerances (the integer products are the same;
the float sums may round in another order with 8 lanes instead of 16).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgellm.errors import ArgumentError
from edgellm.runtime import numba_setup

ROOT = Path(__file__).resolve().parents[1]
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _avx2_host() -> bool:
    import llvmlite.binding as llb

    host = llb.get_host_cpu_features()
    return X86 and all(host.get(f) for f in ("avx2", "fma", "f16c"))


def _isa_env(isa: str) -> dict:
    env = dict(os.environ, EDGELLM_ISA=isa)
    for name in ("EDGELLM_PORTABLE", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
        env.pop(name, None)
    return env


def test_isa_values_are_checked(monkeypatch):
    monkeypatch.setenv("EDGELLM_ISA", "avx3")
    with pytest.raises(ArgumentError, match=r"EDGELLM_ISA='avx3' is not one of native, "
                                            r"portable, avx2$"):
        numba_setup._isa()
    for value, isa in (("", "native"), (" Portable ", "portable")):
        monkeypatch.setenv("EDGELLM_ISA", value)
        assert numba_setup._isa() == isa
    if _avx2_host():
        monkeypatch.setenv("EDGELLM_ISA", "avx2")
        monkeypatch.setenv("NUMBA_CPU_NAME", "skylake-avx512")
        with pytest.raises(ArgumentError, match="EDGELLM_ISA=avx2 sets NUMBA_CPU_NAME"):
            numba_setup._isa()
        monkeypatch.setenv("NUMBA_CPU_NAME", numba_setup.AVX2_CPU)  # what a child inherits
        assert numba_setup._isa() == "avx2"


def test_a_bad_isa_is_one_line_from_the_cli(converted):
    env = dict(os.environ, EDGELLM_ISA="avx512")
    proc = subprocess.run([sys.executable, "-m", "edgellm", "generate", "-m",
                           str(converted("llama", "q4_0")), "-p", "hi", "-n", "1"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "edgellm: error: EDGELLM_ISA='avx512' is not one of native, portable, avx2"]


@pytest.mark.skipif(not _avx2_host(), reason="this CPU cannot run AVX2 code")
def test_avx2_is_refused_once_numba_compiled_for_this_cpu():
    """Set in a running process after numba compiled, it could not change numba's target:
    the kernels would be this CPU's, the label avx2. Refused instead."""
    code = ("import numba; numba.njit(lambda x: x + 1)(1)\n"
            "from edgellm.runtime import simd")
    proc = subprocess.run([sys.executable, "-c", code], env=_isa_env("avx2"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "edgellm.errors.ArgumentError: EDGELLM_ISA=avx2 was read after numba had compiled "
        "for this CPU: set it before Python starts")


PROBE = r"""
import json, re, sys
import numpy as np
sys.path[:0] = [{root!r}, {tests!r}]
import numba
from numba.core.registry import cpu_target
from edgellm.runtime import numba_setup, simd
from edgellm.kernels import linear as L, registry
from edgellm.modelfile import layout as layouts, quant


from test_kernels_asm import fresh_asm  # compiled now, not loaded from the cache


def stats(asm):
    return {{"zmm": asm.count("%zmm"), "ymm": asm.count("%ymm"),
             "mask": len(re.findall(r"%k[0-7]\b", asm)),
             "vnni": asm.count("vpdpbusd") + asm.count("vpdpwssd"),
             "vpmaddwd": asm.count("vpmaddwd")}}


found = {{"path": simd.SIMD_PATH, "isa": simd.ISA, "cache_dir": numba_setup.CACHE_DIR}}
if {asm!r}:
    rng = np.random.default_rng(0)
    N, K = 32, 64
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((1, K)).astype(np.float32)
    out = np.zeros((1, N), np.float32)
    asm = {{}}
    for kind in ("q4_0", "q4_1"):
        wi = layouts.to_x16(quant.quantize(w, kind), kind)
        k = registry.X16[kind]
        for dt in (np.int16, np.int8):
            a = L.quantize_act(x, L.ActQ8(1, K, dt))
            asm[f"x16 {{kind}} {{np.dtype(dt).name}}"] = stats(fresh_asm(
                k["mv_rows"], wi, a.xq, a.xd, a.xs, a.xds, out, 0, N))
        asm[f"x16 {{kind}} precise"] = stats(fresh_asm(k["mvp_rows"], wi, x, out, 0, N))
    wq = quant.quantize(w, "q8_0")
    a = L.quantize_act(x, L.ActQ8(1, K, np.int8))
    asm["rows q8_0 int8"] = stats(fresh_asm(registry.KERNELS[quant.TYPES["q8_0"].code]["mv_rows"],
                                            wq, 32, a.xq, a.xd, a.xds, out, 0, N))
    found["asm"] = asm
    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    found["cpu"], found["avx512"] = cpu, "+avx512f" in features

import edgellm
from conftest import reference
from reference_checks import decode_steps, greedy

ids = [int(t) for t in reference("llama")["input_ids"]][:12]
with edgellm.load({model!r}, threads=2) as llm:
    logits, tokens = decode_steps(llm, ids), greedy(llm, ids[:4], 8)
with edgellm.load({model!r}, precise=True) as llm:
    precise = decode_steps(llm, ids)
np.savez({out!r}, logits=logits, precise=precise, tokens=np.array(tokens))
print(json.dumps(found))
"""


def _probe(isa: str, model: Path, out: Path, asm: bool) -> dict:
    code = PROBE.format(root=str(ROOT), tests=str(ROOT / "tests"), asm=asm, model=str(model),
                        out=str(out))
    proc = subprocess.run([sys.executable, "-c", code], env=_isa_env(isa), cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not X86, reason="an x86-64 target")
@pytest.mark.skipif(not _avx2_host(), reason="this CPU cannot run AVX2 code")
def test_avx2_compiles_no_avx512_and_decodes_as_the_portable_path(converted, tmp_path):
    model = converted("llama", "q4_0")  # x16 q4_0 matrices
    avx2 = _probe("avx2", model, tmp_path / "avx2.npz", asm=True)
    assert avx2["path"] == "portable" and avx2["isa"] == "avx2"
    assert Path(avx2["cache_dir"]).name == "isa-avx2"
    assert avx2["cpu"] == numba_setup.AVX2_CPU and not avx2["avx512"]
    for name, s in avx2["asm"].items():
        assert s["zmm"] == 0 and s["mask"] == 0 and s["vnni"] == 0, (name, s)
        assert s["ymm"] > 0, (name, s)  # vectorized 8 lanes wide
        if "int" in name:
            assert s["vpmaddwd"] > 0, (name, s)
    portable = _probe("portable", model, tmp_path / "portable.npz", asm=False)
    assert portable["path"] == "portable"
    with np.load(tmp_path / "avx2.npz") as a, np.load(tmp_path / "portable.npz") as b:
        assert (a["tokens"] == b["tokens"]).all()
        assert np.abs(a["logits"] - b["logits"]).max() <= 1e-3 * np.abs(b["logits"]).max()
        assert np.abs(a["precise"] - b["precise"]).max() < 1e-4

