"""Architectures by family; `build` resolves config["model_type"] through config.ARCH_ALIASES."""

from __future__ import annotations

from ..config import ARCH_ALIASES, SUPPORTED, ModelArgs
from ..errors import UnsupportedArchitectureError
from ..format import PackedModel


def build(packed: PackedModel, precise: bool = False, context: int | None = None,
          chunk: int = 64, kv_type: str = "f32"):
    """The runnable model of a packed file."""
    model_type = packed.architecture
    family = ARCH_ALIASES.get(model_type)
    if family is None:
        raise UnsupportedArchitectureError(
            f"{packed.path}: architecture {model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED)})")
    args = ModelArgs.from_dict(packed.config)
    if family == "llama":
        from .llama import Llama as cls
    elif family == "gemma3":
        from .gemma3 import Gemma3 as cls
    elif family == "phi3":
        from .phi3 import Phi3 as cls
    elif family == "moe":
        from .moe import MoE as cls
    elif family == "bert":
        from .bert import Bert

        return Bert(packed, args, precise=precise, context=context, chunk=chunk)  # no KV cache
    return cls(packed, args, precise=precise, context=context, chunk=chunk, kv_type=kv_type)
