"""The real models the speculative tests run: the default SmolLM2-135M file and Gemma 3
270M Q4_K_M (its GGUF converted as it is), each skipped, saying why, when absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SMOLLM2 = Path(os.environ.get("EDGELLM_DEFAULT_MODEL") or
               Path.home() / ".cache" / "edgellm" / "models" / "smollm2-135m-instruct.edgellm")
GEMMA3_GGUF = Path(os.environ.get("EDGELLM_GEMMA3_Q4KM", "/tmp/arch-g3/gemma-3-270m-q4_k_m.gguf"))


def smollm2() -> Path:
    if not SMOLLM2.is_file():
        pytest.skip(f"no default model at {SMOLLM2} (edgellm pull, or EDGELLM_DEFAULT_MODEL)")
    return SMOLLM2


def gemma3(tmp_root: Path) -> Path:
    """Gemma 3 270M Q4_K_M converted (kept) into tmp_root once."""
    out = tmp_root / "gemma3-270m-q4_k_m.edgellm"
    if not out.is_file():
        if not GEMMA3_GGUF.is_file():
            pytest.skip("set EDGELLM_GEMMA3_Q4KM to the Gemma 3 270M Q4_K_M GGUF")
        from converter.gguf_source import open_gguf
        from converter.pack import convert

        convert(open_gguf(str(GEMMA3_GGUF)), out, "keep", progress=False)
    return out
