"""The real whisper-base (its CTranslate2 files fetched once: tests/realmodel.py), converted
once per test session at each quantization the tests ask for."""

from __future__ import annotations

from contextlib import contextmanager

import edgellm


@contextmanager
def whisper_base(tmp_path_factory, quant: str):
    """whisper-base at `quant` (f32, q8_0), loaded on one thread: on a shared CPU a parallel
    region waits for its slowest thread."""
    from realmodel import whisper_base_dir

    from converter.cli import open_source
    from converter.pack import convert

    out = tmp_path_factory.getbasetemp() / f"whisper-base-{quant}.edgellm"
    if not out.exists():  # the modules that use it share one conversion
        convert(open_source(str(whisper_base_dir())), out, quant, progress=False)
    with edgellm.load(out, threads=1) as llm:
        yield llm
