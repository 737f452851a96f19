"""Architectures by model_type: each one module with a SPEC (spec.py), found by registry.py."""

from __future__ import annotations

import numpy as np

from ..cache.kv_types import DEFAULT_KV_TYPE
from ..errors import UnsupportedArchitectureError
from ..memory_plan import CHUNK
from ..modelfile.config import ModelArgs
from ..modelfile.format import PackedModel
from .base import Transformer
from .registry import spec_for, supported

# the integer activations quantized weights meet (not precise): int16 blocks keep the float
# model's greedy answers; int8 ones are llama.cpp's (faster where the products bound a step:
# the batched rows of `edgellm serve`; they flip the float model's near-ties)
ACT_TYPES = {"int16": np.int16, "int8": np.int8}


def build(packed: PackedModel, precise: bool = False, context: int | None = None,
          chunk: int = CHUNK, kv_type: str = DEFAULT_KV_TYPE, act_dtype=np.int16,
          args: ModelArgs | None = None):
    """The model a packed file describes, without its fused decode step (the loader,
    edgellm/loader.py, attaches that). args: the file's config as validate.check_model
    parsed it (parsed here when not given). act_dtype: the integer activations of
    quantized weights when not precise (int16, or int8 as llama.cpp: faster, and it flips
    the float model's near-ties)."""
    model_type = packed.architecture
    spec = spec_for(model_type)
    if spec is None:
        raise UnsupportedArchitectureError(
            f"{packed.path}: architecture {model_type!r} is not supported "
            f"(supported: {', '.join(supported())})")
    if args is None:
        args = ModelArgs.from_dict(packed.config)
    if not issubclass(spec.model, Transformer):  # encoders (bert.py): no KV cache
        return spec.model(packed, args, precise=precise, context=context, chunk=chunk)
    return spec.model(packed, args, precise=precise, context=context, chunk=chunk,
                      kv_type=kv_type, act_dtype=act_dtype)
