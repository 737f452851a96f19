"""Shared test helpers: the tiny reference checkpoints and converted files of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "tiny"
TINY_NAMES = sorted(p.name for p in TINY.iterdir() if p.is_dir())
LLAMA_FAMILY = ["llama", "llama-bf16-sharded", "qwen2", "qwen3", "mistral-swa"]


def pytest_configure(config):
    """One fused decode step for every test model: compiled with every op (not each
    model's own, step/fused.py), here and in the CLI's subprocesses, so that the suite
    compiles it once; test_fused_features.py checks a pruned step against it."""
    import os

    from edgellm.step.fused import FusedDecoder

    FusedDecoder.prune = False
    os.environ["EDGELLM_FUSED"] = "all"


# Tests whose time is a child process compiling kernels for another instruction set (its own
# cache tag: nothing shared with the host's kernels), run first. The README's `-n 2` hands
# each worker a consecutive quarter of its share to start with, so these run one after
# another on the first worker while the second compiles the host's kernels alone (two
# workers starting on the same kernels would take turns: one compiles a kernel while the
# other waits for it, runtime/numba_loading.py), and none is left to start near the end
# while the other worker idles. Longest first.
FIRST = [
    "tests/test_portable.py::test_kernel_and_fused_tests_pass_on_the_portable_path",
    "tests/test_isa.py::test_avx2_compiles_no_avx512_and_decodes_as_the_portable_path",
    "tests/test_kernels_asm.py::test_generic_cpu_is_portable_and_correct",
    "tests/test_kernels_asm.py::test_portable_path_emits_vpmaddwd",
]


def pytest_collection_modifyitems(session, config, items):
    """FIRST's tests moved to the front, in FIRST's order (the same in every xdist worker,
    as xdist requires of their collections)."""
    rank = {nodeid: i for i, nodeid in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))  # stable: the rest as is


def reference(name: str) -> dict:
    """The transformers outputs stored with tiny fixture `name`."""
    with np.load(TINY / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """converted(name, quant) -> path of the fixture converted at `quant` (cached)."""
    from converter.hf_source import open_hf
    from converter.pack import convert

    root = tmp_path_factory.mktemp("converted")
    done: dict[tuple[str, str], Path] = {}

    def get(name: str, quant: str = "f32", block_size: int = 32, layout: str = "x16") -> Path:
        """layout: convert-model's --layout ("x16", its default, or "rows")."""
        key = (name, f"{quant}-{block_size}-{layout}")
        if key not in done:
            out = root / f"{name}-{quant}-{block_size}{'-rows' * (layout == 'rows')}.edgellm"
            convert(open_hf(TINY / name), out, quant, block_size, progress=False,
                    layout="" if layout == "rows" else layout)
            done[key] = out
        return done[key]

    return get


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """The real SmolLM2-135M-Instruct GGUF converted without requantizing (tests/realmodel.py)."""
    from realmodel import smollm2_gguf_path

    from converter.gguf_source import open_gguf
    from converter.pack import convert

    out = tmp_path_factory.mktemp("smollm2") / "smollm2.edgellm"
    convert(open_gguf(smollm2_gguf_path()), out, "keep", progress=False)
    return out


def name_whisper_segments(monkeypatch) -> None:
    """The tiny random Whisper checkpoint has no tokenizer (every text empty): give each
    segment a text, " segment ID"."""
    from edgellm.transcribe import Transcriber

    segments = Transcriber.segments

    def named(self, *a, **k):
        for s in segments(self, *a, **k):
            s.text = f" segment {s.id}"
            yield s

    monkeypatch.setattr(Transcriber, "segments", named)


def warm_smollm2(path, context: int):
    """SmolLM2 (the `smollm2` fixture's file) loaded with `context` tokens and warmed up, as
    a module's fixture yields it: `yield from warm_smollm2(smollm2, 2048)`."""
    import edgellm

    with edgellm.load(path, context=context) as model:
        model.model.warmup()
        yield model


def attention_inputs(seed: int, T: int, cap: int, Hq: int, Hkv: int, Dh: int):
    """Random attention arguments: q [T, Hq, Dh], the chunk's k/v [T, Hkv, Dh] at positions
    cap.., a cache's k/v [cap, Hkv, Dh] at positions 0.. with slot 2 empty (cap > 3).
    Returns (q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, Hq, Dh), dtype=np.float32)
    k_new, v_new = (rng.standard_normal((T, Hkv, Dh), dtype=np.float32) for _ in range(2))
    k_cache, v_cache = (rng.standard_normal((cap, Hkv, Dh), dtype=np.float32)
                        for _ in range(2))
    cache_pos = np.arange(cap, dtype=np.int64)
    if cap > 3:
        cache_pos[2] = -1  # an empty slot
    q_pos = np.arange(cap, cap + T, dtype=np.int64)
    return q, k_new, v_new, q_pos, k_cache, v_cache, cache_pos


def load_converted(tmp_path_factory, source: Path, **load):
    """The checkpoint folder `source` converted at f32 into a temporary file and loaded with
    `load`'s arguments, as a module's fixture yields it: `yield from load_converted(...)`."""
    import edgellm
    from converter.hf_source import open_hf
    from converter.pack import convert

    path = tmp_path_factory.mktemp(source.name) / f"{source.name}.edgellm"
    convert(open_hf(source), path, "f32", progress=False)
    with edgellm.load(path, **load) as model:
        yield model

