"""The kernels' machine code still uses the instructions they were written for.

A numba/llvmlite upgrade can silently change what the IR in edgellm.kernels' code generators
lowers to; these tests read the assembly of freshly compiled (uncached) kernels:
  VNNI path       vpdpbusd in the int8 matvec and matmul kernels, vpdpwssd in the int16
                  q4 row groups and the prefill panels; AMX tile products in the prefill
                  panels where the CPU has AMX
  portable path   (EDGELLM_PORTABLE=1, in a subprocess) vpmaddwd and no vpdpbusd
  precise path    packed float multiply-adds
  K-quants        (kquant.py, float activations) vectorized dequantization and multiply-adds
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from edgellm.kernels import act_quant, kquant, kquant_int, matmul, registry
from edgellm.kernels import panel as panel_mod
from edgellm.kernels.tiles import TILES
from edgellm.modelfile import quant
from edgellm.runtime import simd

X86 = platform.machine().lower() in ("x86_64", "amd64")
ROOT = Path(__file__).resolve().parents[1]
QTYPES = ("q8_0", "q4_0", "q4_1")


def int16_dots(asm: str) -> int:
    """The int16 block dots in asm when the VNNI IR was chosen: vpdpwssd, or 0 without one.
    LLVM's scheduler may split a vpdpwssd on the critical path into vpmaddwd + vpaddd (its
    Sapphire Rapids model does, in some tiles): those count too, once a vpdpwssd shows that
    the VNNI IR, not the generic one, was lowered."""
    n = asm.count("vpdpwssd")
    return n + asm.count("vpmaddwd") if n else 0


def _kernel(kind: str, role: str):
    """The generated kernel `role` of type `kind` (registry.KERNELS, by type code)."""
    return registry.KERNELS[quant.TYPES[kind].code][role]


# assembly already read in this process, by (kernel, argument types): tests that check
# different instructions of one kernel share its compile (a prefill panel kernel takes
# seconds; the AMX test reads the same panels as the int16 VNNI one)
_ASM: dict[tuple, str] = {}


def fresh_asm(dispatcher, *args) -> str:
    """Assembly of dispatcher's Python function compiled now (once per process and argument
    types), bypassing the kernel cache."""
    sig = tuple(numba.typeof(a) for a in args)
    key = (dispatcher, sig)
    if key not in _ASM:
        options = dict(dispatcher.targetoptions, cache=False)
        options.pop("nopython", None)
        f = numba.njit(**options)(dispatcher.py_func)
        f.compile(sig)
        _ASM[key] = f.inspect_asm(sig)
    return _ASM[key]


def fresh_ir(dispatcher, *args) -> str:
    """LLVM IR of dispatcher's Python function compiled now, bypassing the kernel cache: what
    the code generator chose, before the target's scheduling model rewrites instructions."""
    options = dict(dispatcher.targetoptions, cache=False)
    options.pop("nopython", None)
    f = numba.njit(**options)(dispatcher.py_func)
    sig = tuple(numba.typeof(a) for a in args)
    f.compile(sig)
    return f.inspect_llvm(sig)


def probe_asm(probe, *args) -> str:
    """Assembly of the Python function probe (calling an intrinsic) compiled for args."""
    f = numba.njit(probe)
    sig = tuple(numba.typeof(a) for a in args)
    f.compile(sig)
    return f.inspect_asm(sig)


def sample_args():
    w = np.zeros((4, 36), np.uint8)
    w.flags.writeable = False
    xq = np.zeros((1, 32), np.int8)
    f = np.zeros((1, 32), np.float32)
    return w, xq, f


def int8_asm(kind: str) -> tuple[str, str]:
    w, xq, f = sample_args()
    mv = fresh_asm(_kernel(kind, "mv_rows"), w, 32, xq, f, f, f, 0, 4)
    xs = np.zeros((1, 1), np.int32)
    panel, scales = matmul.panel_scratch(32)
    mm = fresh_asm(_kernel(kind, "mm_rows"), w, 32, xq, f, xs, f, f, 0, 4, 1,
                   panel, scales)
    return mv, mm


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
@pytest.mark.parametrize("kind", QTYPES)
def test_vnni_path_emits_vpdpbusd(kind):
    for asm in int8_asm(kind):
        assert "vpdpbusd" in asm
        assert "vpmaddwd" not in asm


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
@pytest.mark.parametrize("kind", ("q4_0", "q4_1"))
def test_vnni_int16_row_groups_emit_vpdpwssd(kind):
    """The default decode path's q4 row groups (int16 activations): vpdpwssd, two per row
    pair (codegen_int8._q4_i16_vnni_group_codegen; the last rows' 1x1 tile is vpmaddwd)."""
    w = np.zeros((8, 18 if kind == "q4_0" else 20), np.uint8)
    w.flags.writeable = False
    xq, f = np.zeros((1, 32), np.int16), np.zeros((1, 8), np.float32)
    asm = fresh_asm(_kernel(kind, "mv_rows"), w, 32, xq, f, f, f, 0, 8)
    assert int16_dots(asm) >= 8


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
def test_vnni_int16_q8_0_rows_emit_vpdpwssd():
    """The default decode path's q8_0 rows (the 4x1 tile: output heads, q8_0 files) on int16
    activations: one vpdpwssd per row and block, kept in 16 float lanes
    (codegen_int8._q8act_row_codegen's `wide`)."""
    w = np.zeros((4, 34), np.uint8)
    w.flags.writeable = False
    xq, f = np.zeros((1, 32), np.int16), np.zeros((1, 4), np.float32)
    kernel = _kernel("q8_0", "mv_rows")
    asm = fresh_asm(kernel, w, 32, xq, f, f, f, 0, 4)
    if "vpdpwssd" in asm:
        assert int16_dots(asm) >= 4
    else:  # LLVM's Sapphire Rapids model splits every one (vpmaddwd + vpaddd): the IR's choice
        assert "llvm.x86.avx512.vpdpwssd" in fresh_ir(kernel, w, 32, xq, f, f, f, 0, 4)
        assert asm.count("vpmaddwd") >= 4


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
@pytest.mark.parametrize("kind", QTYPES)
def test_vnni_int16_prefill_panels_emit_vpdpwssd(kind):
    """Prefill's panel tiles on int16 activations (the default path's): one vpdpwssd per
    chunk and token (panel.py)."""
    w, _, f = sample_args()
    xq, xs = np.zeros((1, 32), np.int16), np.zeros((1, 1), np.int32)
    panel, scales = matmul.panel_scratch(32)
    asm = fresh_asm(_kernel(kind, "mm_rows"), w, 32, xq, f, xs, f, f, 0, 4, 1,
                    panel, scales)
    assert int16_dots(asm) >= 8 * 11  # the 8x6, 8x4 and 8x1 tiles' chunks


@pytest.mark.skipif(not simd.AMX, reason="no AMX-INT8 here (CPU, OS or EDGELLM_NO_AMX)")
@pytest.mark.parametrize("kind", QTYPES)
def test_amx_prefill_panels_emit_tile_products(kind):
    """Where the CPU has AMX, prefill's panels on int16 activations also run on AMX tiles
    (amx.py): a tile configuration, tile loads and stores, and the two products of a
    block (low bytes unsigned, high bytes signed; q8_0's codes signed, q4's unsigned)."""
    w, _, f = sample_args()
    xq, xs = np.zeros((1, 32), np.int16), np.zeros((1, 1), np.int32)
    panel, scales = matmul.panel_scratch(32)
    asm = fresh_asm(_kernel(kind, "mm_rows"), w, 32, xq, f, xs, f, f, 0, 4, 1,
                    panel, scales)
    products = ("tdpbusd", "tdpbssd") if kind == "q8_0" else ("tdpbuud", "tdpbsud")
    for op in ("ldtilecfg", "tileloadd", "tilestored", "tilerelease", *products):
        assert op in asm, op
    assert int16_dots(asm) >= 8 * 11  # the panel tiles stay for T < 32 and a last group


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
@pytest.mark.parametrize("rt", (1, 4))
def test_vnni_int16_q6_k_panel_tiles_emit_vpdpwssd(rt):
    """q6_k's own prefill panel tiles (panel.py: signed codes, a scale per 16 values) on
    int16 activations: one vpdpwssd per chunk and token (LLVM's scheduler may split some
    into vpmaddwd + vpaddd, as it did for a 4-token tile on Sapphire Rapids), on zmm."""
    tile = getattr(panel_mod, f"ptile_q6_k_8x{rt}")

    def probe(panel, scales, xq, xd, xs, xds, out):
        tile(panel, scales, 0, xq, xd, xs, xds, 0, out, 0)

    panel, scales = matmul.panel_scratch(256)
    xq, xs = np.zeros((4, 256), np.int16), np.zeros((4, 8), np.int32)
    f, out = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    fn = numba.njit(probe)
    sig = tuple(numba.typeof(a) for a in (panel, scales, xq, f, xs, f, out))
    fn.compile(sig)
    asm = fn.inspect_asm(sig)
    assert int16_dots(asm) >= 8 * rt
    assert re.search(r"vp(dpwssd|maddwd)\s[^\n]*%zmm", asm)


PORTABLE_PROBE = """
import json, sys
sys.path.insert(0, {root!r})
from tests.test_kernels_asm import int8_asm
from edgellm.runtime import simd
found = {{"path": simd.SIMD_PATH}}
for kind in ("q8_0", "q4_0", "q4_1"):
    asm = "\\n".join(int8_asm(kind))
    found[kind] = {{op: asm.count(op) for op in ("vpdpbusd", "vpmaddwd")}}
print(json.dumps(found))
"""


@pytest.mark.skipif(not X86, reason="vpmaddwd is an x86 instruction")
def test_portable_path_emits_vpmaddwd():
    env = dict(os.environ, EDGELLM_PORTABLE="1")
    proc = subprocess.run([sys.executable, "-c", PORTABLE_PROBE.format(root=str(ROOT))],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["path"] == "portable"
    for kind in QTYPES:
        assert found[kind]["vpdpbusd"] == 0, kind
        assert found[kind]["vpmaddwd"] > 0, kind


GENERIC_PROBE = """
import json, sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.test_kernels_linear import make_weight, make_x, oracle, run
from edgellm.kernels import linear as L
from edgellm.runtime import simd
errors = {{}}
for kind in ("q8_0", "q4_1", "f16"):
    w = make_weight(kind, 9, 64)
    for T in (1, 5):
        x = make_x(T, 64)
        for precise in (False, True):
            ref, scale = oracle(w, x, precise)
            err = np.abs(run(w, x, precise=precise) - ref) / scale
            errors[f"{{kind}} T={{T}} precise={{precise}}"] = float(err.max())
    out = np.empty((2, 64), np.float32)
    L.embedding(w, np.array([3, 8]), out)
    errors[f"{{kind}} embedding"] = float(np.abs(out - w.dequantize()[[3, 8]]).max())
print(json.dumps({{"path": simd.SIMD_PATH, "native_f16": simd.NATIVE_F16, "errors": errors}}))
"""


@pytest.mark.skipif(not X86, reason="the generic x86-64 target")
def test_generic_cpu_is_portable_and_correct():
    """NUMBA_CPU_NAME=generic: no VNNI, and no F16C, so f16 is converted in integer IR
    (LLVM's fallback is a runtime-library call numba does not provide: a segfault)."""
    env = dict(os.environ, NUMBA_CPU_NAME="generic")
    env.pop("EDGELLM_PORTABLE", None)
    proc = subprocess.run([sys.executable, "-c", GENERIC_PROBE.format(root=str(ROOT))],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["path"] == "portable" and not found["native_f16"]
    bad = {k: v for k, v in found["errors"].items() if not v < 2e-5}
    assert not bad, bad


@pytest.mark.skipif(not X86, reason="checks x86 vector registers")
def test_float_paths_are_vectorized():
    w, xq, f = sample_args()
    packed_fma = re.compile(r"vfmadd\S*\s[^\n]*%[yz]mm")
    for kind in QTYPES:
        asm = fresh_asm(_kernel(kind, "mvp_rows"), w, 32, f, f, 0, 4)
        assert packed_fma.search(asm), kind
    wf = np.zeros((4, 32), np.float32)
    assert packed_fma.search(fresh_asm(_kernel("f32", "mvp_rows"), wf, 32, f, f, 0, 4))
    wh = np.zeros((4, 32), np.uint16)
    asm = fresh_asm(_kernel("f16", "mvp_rows"), wh, 32, f, f, 0, 4)
    assert packed_fma.search(asm) and "vcvtph2ps" in asm
    x = np.zeros((1, 64), np.float32)
    q = fresh_asm(act_quant.quantize_rows, x, np.zeros((1, 64), np.int8), f, np.zeros(
        (1, 2), np.int32), f, 0, 1)
    assert re.search(r"vmulps\s[^\n]*%[yz]mm", q)


@pytest.mark.skipif(not X86, reason="checks x86 vector registers")
@pytest.mark.parametrize("kind", [n for n in quant.K_TYPES if not quant.TYPES[n].packing])
def test_kquant_paths_are_vectorized(kind):
    """kquant.py's decode rows: the row dequantizer converts codes to floats in vector
    registers (its runtime trip counts keep LLVM's loop vectorizer on) and the dot product is
    packed multiply-adds."""
    t = quant.TYPES[kind]
    w = np.zeros((4, t.block_bytes(256)), np.uint8)
    w.flags.writeable = False
    f = np.zeros((1, 256), np.float32)
    asm = fresh_asm(kquant.mvp_rows_k, t.code, w, f, f, 0, 4)
    assert re.search(r"vfmadd\S*\s[^\n]*%[yz]mm", asm)
    assert re.search(r"vcvtdq2ps\s[^\n]*%[yz]mm", asm), kind


def _kq_tile_asm(kind: str, dtype, rt: int = 1) -> str:
    """Assembly of kind's 1 x rt tile (decode's 1x1, prefill's 1x4) on dtype activations,
    one super-block a row."""
    t = quant.TYPES[kind]
    w = np.zeros((4, t.block_bytes(256)), np.uint8)
    w.flags.writeable = False
    xq, f = np.zeros((4, 256), dtype), np.zeros((4, 8), np.float32)
    out = np.zeros((4, 4), np.float32)
    tile = TILES[t.code][str(rt)]

    def probe(w, xq, xd, xds, out):
        tile(w, 256, 0, xq, xd, xds, 0, out)

    return probe_asm(probe, w, xq, f, f, out)


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
def test_vnni_int16_q6_k_decode_tile_scales_the_pair_sums():
    """q6_k's decode tile on int16 activations: its per-16 scales multiply the first level of
    pair sums (4 vpmulld a super-block), not each block's widened codes (8 vpmullw)."""
    asm = _kq_tile_asm("q6_k", np.int16)
    assert int16_dots(asm) >= 8
    assert "vpmullw" not in asm and asm.count("vpmulld") <= 4


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
def test_vnni_int16_q4_k_decode_tile_widens_64_codes_at_a_time():
    """q4_k's decode tile on int16 activations (the default path): the tile is bound by the
    vector pipes, so each 32 nibble bytes are widened once (vpmovzxbw) for two blocks: four
    widenings and eight vpdpwssd a super-block (codegen/kquant_tiles._codes16)."""
    asm = _kq_tile_asm("q4_k", np.int16)
    assert int16_dots(asm) >= 8
    assert asm.count("vpmovzxbw") <= 4


@functools.cache  # one compile for every test reading the tile
def _kk_tile_asm(kind: str, dtype, rt: int = 1) -> str:
    """Assembly of kind's 1 x rt tile on super-block activations (act_quant_k's ActK)."""
    t = quant.TYPES[kind]
    w = np.zeros((4, t.block_bytes(256)), np.uint8)
    w.flags.writeable = False
    xq, xd = np.zeros((4, 256), dtype), np.zeros((4, 1), np.float32)
    xb, out = np.zeros((4, 16), np.int32), np.zeros((4, 4), np.float32)
    tile = TILES[t.code][str(rt)]

    def probe(w, xq, xd, xb, out):
        tile(w, 256, 0, xq, xd, xb, 0, out)

    return probe_asm(probe, w, xq, xd, xb, out)


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
@pytest.mark.parametrize("kind", ["q4_k", "q5_k", "q6_k"])
def test_vnni_int16_superblock_tiles_split_into_vpdpbusd(kind):
    """The decode tile on int16 super-block activations (act_quant_k.SPLIT: low and high
    bytes): two vpdpbusd per 64 values (q6_k: three), no codes widened to 16 bits and
    multiplied by their scale (vpmullw); q4_k / q5_k keep each lane's two byte-half sums as
    an i16 pair and scale them with one vpdpwssd (q6_k's low-byte dot may be negative: no
    pair, no vpdpwssd)."""
    asm = _kk_tile_asm(kind, np.int16)
    assert asm.count("vpdpbusd") >= (12 if kind == "q6_k" else 8)
    assert "vpmullw" not in asm
    assert ("vpdpwssd" in asm) == (kind != "q6_k"), kind


@pytest.mark.skipif(not X86, reason="checks x86 prefetch instructions")
@pytest.mark.parametrize("kind", ["q4_k", "q5_k", "q6_k"])
def test_superblock_decode_tiles_prefetch_ahead(kind):
    """Decode's one-token super-block tiles prefetch the weights PF bytes ahead into L1 (a
    line per 64 bytes of a super-block: the hardware prefetcher alone keeps one core's
    stream short of memory's rate, and L2 left it short on the file's 4 KiB pages);
    prefill's 4-token tiles, bound by their dot products, do not."""
    for dtype in (np.int16, np.int8):
        assert "prefetcht0" in _kk_tile_asm(kind, dtype), (kind, dtype)
        assert "prefetch" not in _kk_tile_asm(kind, dtype, 4), (kind, dtype)


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
def test_vnni_int16_q4_k_superblock_tile_unpacks_in_vectors():
    """q4_k's decode tile on int16 super-block activations: each 32 code bytes broadcast to
    both halves of a register and split into nibbles by one gf2p8affineqb where the CPU has
    GFNI, else shifted by 0 or 4 per half (vpsrlvw); no halves joined (vinserti64x4); the
    6-bit scales and minima unpacked in xmm operations, not scalar shifts and masks
    (kquant_tiles._sc_min_bytes)."""
    asm = _kk_tile_asm("q4_k", np.int16)
    unpack = "vgf2p8affineqb" if simd.GFNI else "vpsrlvw"
    assert asm.count(unpack) >= 4 and "vinserti64x4" not in asm
    assert not re.search(r"\b(shrl|andl)\b", asm)


@pytest.mark.skipif(simd.SIMD_PATH != "vnni", reason="host lacks AVX512-VNNI (or portable forced)")
@pytest.mark.parametrize("kind", ["q4_k", "q5_k", "q6_k"])
def test_vnni_int8_kquant_tiles_emit_vpdpbusd(kind):
    """The K-quant tiles on int8 activations (decode's 1x1, prefill's 1x4): one vpdpbusd per
    two blocks of 32 (q6_k: and one for its -32 offset), no widening to 16 bits."""
    for rt in (1, 4):
        asm = _kq_tile_asm(kind, np.int8, rt)
        assert asm.count("vpdpbusd") >= 4 * rt, (kind, rt)
        assert "vpmaddwd" not in asm and "vpmovsxbw" not in asm, (kind, rt)


@pytest.mark.skipif(not X86, reason="checks x86 vector registers")
@pytest.mark.parametrize("kind", [n for n in quant.K_TYPES if quant.TYPES[n].int8_kernels
                                  and not quant.TYPES[n].packing])  # (iq4_nl: q8_0's tiles)
def test_kquant_int_tiles_are_vectorized(kind):
    """kquant_int.py's tiles (decode's 1x1, prefill's 1x4), int16 activations: the block dots
    are vpmaddwd on 256- or 512-bit registers, the per-block sums reduced with vphaddd,
    scaled as packed floats; on AVX-512 VNNI their dots are vpdpwssd instead
    (codegen_kquant._block_dot_wssd), reduced with permutes."""
    t = quant.TYPES[kind]
    B = t.blocks[0]
    w = np.zeros((4, t.block_bytes(B) * 256 // B), np.uint8)
    w.flags.writeable = False
    xq = np.zeros((4, 256), np.int16)
    f = np.zeros((4, 8), np.float32)
    out = np.zeros((4, 4), np.float32)
    wssd = simd.SIMD_PATH == "vnni"
    dot = "vpdpwssd" if wssd else "vpmaddwd"
    for rt in (1, 4):
        tile = (TILES[t.code][str(rt)] if t.code in TILES  # q5_0, q5_1: tiles.py
                else getattr(kquant_int, f"ktile_{kind}_1x{rt}"))

        def probe(w, xq, xd, xds, out):
            tile(w, B, 0, xq, xd, xds, 0, out)

        f_ = numba.njit(probe)
        sig = tuple(numba.typeof(a) for a in (w, xq, f, f, out))
        f_.compile(sig)
        asm = f_.inspect_asm(sig)
        assert re.search(dot + r"\s[^\n]*%[yz]mm", asm), (kind, rt)
        if not wssd:
            assert re.search(r"vphaddd\s[^\n]*%ymm", asm), (kind, rt)
        assert re.search(r"vcvtdq2ps\s[^\n]*%ymm", asm), (kind, rt)
        dots = int16_dots(asm) if wssd else asm.count(dot)
        assert dots >= rt * (8 if B == 256 else 4), (kind, rt)


def _probe(tile):
    """A jitted f(w, xq, xd, xds, out) running the tile on row 0, token 0 (blocks of 32)."""
    def probe(w, xq, xd, xds, out):
        tile(w, 32, 0, xq, xd, xds, 0, out)
    return numba.njit(probe)


@pytest.mark.skipif(not X86 or simd.SIMD_PATH != "vnni", reason="the vnni path's lookup")
def test_iq4_nl_tiles_look_its_levels_up_with_vpshufb():
    """iq4_nl runs q8_0's tiles on its int8 levels: one vpshufb of the 16-entry table per 32
    codes in the decode tiles (int16 activations: vpdpwssd; int8: vpdpbusd)."""
    t = quant.TYPES["iq4_nl"]
    w = np.zeros((4, t.block_bytes(32) * 8), np.uint8)
    w.flags.writeable = False
    f = np.zeros((4, 8), np.float32)
    out = np.zeros((4, 4), np.float32)
    for role in ("1", "g"):
        for xq, dot in ((np.zeros((4, 256), np.int16), "vpdpwssd"),
                        (np.zeros((4, 256), np.int8), "vpdpbusd")):
            f_ = _probe(TILES[t.code][role])
            sig = tuple(numba.typeof(a) for a in (w, xq, f, f, out))
            f_.compile(sig)
            asm = f_.inspect_asm(sig)
            assert re.search(r"vpshufb\s[^\n]*%[xyz]mm", asm), (role, dot)
            assert re.search(dot + r"\s[^\n]*%[yz]mm", asm), (role, dot)


@pytest.mark.skipif(not X86, reason="checks x86 vector registers")
@pytest.mark.parametrize("kind", ["q5_0", "q5_1"])
def test_q5_row_group_tiles(kind):
    """Decode's q5_0 / q5_1 row-group tile (tiles.py's "g"): on AVX-512 VNNI the
    q4 row group's vpdpwssd dots (two per row pair and block) with each code's fifth bit
    added under a mask register; elsewhere the 1x1 tile's vpmaddwd, row by row."""
    t = quant.TYPES[kind]
    w = np.zeros((8, t.block_bytes(32) * 8), np.uint8)
    w.flags.writeable = False
    xq = np.zeros((1, 256), np.int16)
    f = np.zeros((1, 8), np.float32)
    out = np.zeros((1, 8), np.float32)
    tile = TILES[t.code]["g"]

    def probe(w, xq, xd, xds, out):
        tile(w, 32, 0, xq, xd, xds, 0, out)

    asm = probe_asm(probe, w, xq, f, f, out)
    if simd.SIMD_PATH == "vnni":
        assert int16_dots(asm) >= 8, kind
        assert re.search(r"%zmm\d+ \{%k\d\}", asm), kind
    else:
        assert re.search(r"vpmaddwd\s[^\n]*%[yz]mm", asm), kind


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize("kind, dtype", [
    *((k, d) for k in ("q4_0", "q4_1") for d in (np.int16, np.int8)),
    ("q8_0", np.int16), ("q4_0", np.uint16), ("q4_1", np.uint16)])
def test_interleaved_tiles(kind, dtype):
    """The batched step's interleaved tiles (interleave.itile_<kind>_16x4): on AVX-512 VNNI
    16 vpdpwssd a block and token for int16 activations (q4: on words permuted in registers,
    the x16 layout being vpdpbusd's; as prefill's pairs(), uint16, permuted in memory: every
    pair a broadcast operand), 8 vpdpbusd for int8 ones (q4; q8_0's int8 activations reach
    its tiles widened to int16: x16.tile_acts) (inline
    assembly: not split into vpmaddwd + vpaddd), each activation pair or quadruple the
    instruction's broadcast memory operand (ir.vpdpwssd_bcast, vpdpbusd_bcast: no separate
    broadcast), and no horizontal sums; elsewhere vpmaddwd."""
    from edgellm.kernels import interleave

    w = np.zeros((1, interleave.ILV_BLOCK[kind] * 2), np.uint8)
    w.flags.writeable = False
    xq = np.zeros((4, 64), dtype)
    f = np.zeros((4, 2), np.float32)
    xs = np.zeros((4, 2), np.int32)
    out = np.zeros((4, 16), np.float32)
    tile = TILES[quant.TYPES[kind].code]["i4"]

    def probe(w, xq, xd, xs, xds, out):
        tile(w, 0, xq, xd, xs, xds, 0, out, 0)

    asm = probe_asm(probe, w, xq, f, xs, f, out)
    if simd.SIMD_PATH == "vnni" and dtype == np.int16 and kind != "q8_0":
        # the x16 byte layout (vpdpbusd's): the block's activations permuted in registers
        # to meet the nibble pairs, each pair a broadcast word: 16 vpdpwssd a block and token
        dots = re.findall(r"vpdpwssd\s+[^\n]*%zmm\d+, %zmm\d+", asm)
        assert len(dots) >= 64 and asm.count("vpmaddwd") == 0, kind
        assert "vphaddd" not in asm, kind
    elif simd.SIMD_PATH == "vnni":
        op, per = ("vpdpbusd", 32) if dtype == np.int8 else ("vpdpwssd", 64)
        folded = re.findall(op + r"\s+-?\d*\(%\w+\)\{1to16\}, %zmm\d+, %zmm\d+", asm)
        assert len(folded) >= per and asm.count("vpmaddwd") == 0, kind
        assert asm.count("vpbroadcastd") + asm.count("vbroadcastss") < len(folded) // 4, kind
        assert "vphaddd" not in asm, kind
    elif dtype == np.int16:
        assert re.search(r"vpmaddwd\s[^\n]*%[yz]mm", asm), kind
