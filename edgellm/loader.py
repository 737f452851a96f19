"""The loader: a packed file's model (arch/) with its fused decode step attached.

arch/ describes models and never imports the step; this is where the two meet.
"""

from __future__ import annotations

import numpy as np

from . import arch
from .cache.kv_types import DEFAULT_KV_TYPE
from .memory_plan import CHUNK
from .modelfile.config import ModelArgs
from .modelfile.format import PackedModel


def build(packed: PackedModel, precise: bool = False, context: int | None = None,
          chunk: int = CHUNK, kv_type: str = DEFAULT_KV_TYPE, fused: bool = True, act_dtype=np.int16,
          args: ModelArgs | None = None, kv_spare: int = 0):
    """The runnable model of a packed file (arch.build's arguments); fused: decoders decode
    through the fused step (one compiled step per token, step/fused.py) where the model's
    weights allow it, else through the per-operation path. kv_spare: sliding layers' cache
    slots beyond their window (KVCache spare: a speculative verify step's rows)."""
    model = arch.build(packed, precise=precise, context=context, chunk=chunk,
                       kv_type=kv_type, act_dtype=act_dtype, args=args)
    if kv_spare and isinstance(model, arch.Transformer):
        model.kv_spare = kv_spare
        model.cache = model.new_cache()
    if fused and isinstance(model, arch.Transformer):
        from .step.fused import FusedDecoder

        model.fused = FusedDecoder.build(model, act_dtype=model.act_dtype)
    return model
