"""`convert-model SRC OUT --lora DIR[:SCALE]`: LoRA adapters merged into float weights.

W' = W + sum_i s_i scale_i B_i A_i in float32, before the weight is quantized to the
recipe's type, so the low-rank delta is quantized once with the weight. Only from a float
source (safetensors f32/f16/bf16, f16/f32 GGUF tensors): merging into already quantized
weights and quantizing again rounds most of the delta away, so a quantized source is
refused with a pointer to the run-time path (edgellm --lora).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgellm.errors import SourceError
from edgellm.lora import open_adapter

from .source import Source, SourceTensor

FLOAT = ("f32", "f16", "bf16")


def merge_lora(source: Source, specs: list[tuple[str, float]]) -> tuple[Source, list[str]]:
    """`source` with each adapter merged into the weights it targets; the merged names."""
    adapters = [(open_adapter(path), scale) for path, scale in specs]
    found = {t.name: t for t in source.tensors()}  # lazy tensors: nothing is loaded here
    parts: dict[str, list] = {}
    for adapter, scale in adapters:
        for m in adapter.modules.values():
            t = found.get(m.weight)
            if t is None:
                raise SourceError(f"{adapter.path}: target module {m.name} does not exist in "
                                  f"{source.path}")
            if len(t.shape) != 2 or m.A.shape[1] != t.shape[1] or m.B.shape[0] != t.shape[0]:
                raise SourceError(f"{adapter.path}: {m.name}: lora_A {list(m.A.shape)} / "
                                  f"lora_B {list(m.B.shape)} do not fit {m.weight} "
                                  f"{list(t.shape)}")
            if t.dtype not in FLOAT:
                raise SourceError(
                    f"{source.path}: {m.weight} is stored as {t.dtype}: merging a LoRA into "
                    "quantized weights rounds it away; convert the source as it is and apply "
                    "the adapter at run time (edgellm generate --lora DIR)")
            parts.setdefault(m.weight, []).append((m, scale))

    def merged(t: SourceTensor) -> SourceTensor:
        def load() -> np.ndarray:
            w = np.array(t.load(), np.float32)
            for m, scale in parts[t.name]:
                w += np.float32(m.scale * scale) * (m.B @ m.A)
            return w
        return replace(t, load=load, load_raw=None)

    def tensors():
        for t in source.tensors():
            yield merged(t) if t.name in parts else t

    return replace(source, tensors=tensors), sorted(parts)
