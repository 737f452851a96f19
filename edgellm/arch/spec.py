"""What an architecture declares about itself: model types, tensors, checks, GGUF names.

Each architecture module (llama.py, gemma3.py, ...) ends with `SPEC = ArchSpec(...)`; the
registry (registry.py) finds it by model_type. One table of tensors per architecture
drives loading (`Transformer.layer_weights`), the loader's shape checks (validate.py) and
the GGUF name map (converter/gguf_names.py):

    TensorSpec(name, role, shape, required, field, gguf)
      name     under "model.layers.N." (Hugging Face's name; "{e}" runs over experts)
      role     VEC (an f32 vector) or MAT (a matrix of a type the linear kernels run)
      shape    in named dimensions (validate.py's DIM_NAMES, plus the spec's `dims`)
      field    the attribute of the layer's weights it loads into (None: not loaded here)
      gguf     llama.cpp's name under "blk.N." (None: GGUF files do not carry it)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

VEC, MAT = "vector", "matrix"
REQ, OPT = True, False


@dataclass(frozen=True)
class TensorSpec:
    name: str
    role: str
    shape: tuple[str, ...]
    required: bool = REQ
    field: str | None = None
    gguf: str | None = None


# Tensors outside the layers, shared by every decoder.
GLOBAL = (
    TensorSpec("model.embed_tokens.weight", MAT, ("vocab", "hidden"), gguf="token_embd.weight"),
    TensorSpec("model.norm.weight", VEC, ("hidden",), gguf="output_norm.weight"),
    TensorSpec("lm_head.weight", MAT, ("vocab", "hidden"), OPT,  # absent: tied
               gguf="output.weight"),
)


def _all_layers(spec: ArchSpec, args, i: int) -> Sequence[TensorSpec]:
    return spec.tensors


@dataclass(frozen=True, eq=False)
class ArchSpec:
    """An architecture: the model_types it serves, its runtime class and its tensors."""

    model_types: tuple[str, ...]
    family: str
    model: type  # a Transformer subclass (arch/base.py)
    tensors: tuple[TensorSpec, ...]  # every tensor a layer may have
    # the tensors of layer i of a model with these args (default: `tensors`)
    layer_tensors: Callable[[ArchSpec, object, int], Sequence[TensorSpec]] = _all_layers
    dims: Callable[[object], dict] | None = None  # named dimensions beyond validate's own
    # every tensor of the model, (name, role, shape, required), where the architecture
    # does not have GLOBAL + model.layers.N (encoders)
    expected: Callable[[object], Iterable[tuple]] | None = None
    check: Callable[[str, object], None] | None = None  # config checks of this family
    gguf: dict[str, tuple[str, str]] = field(default_factory=dict)  # GGUF arch -> (model_type,
    #                                                                HF architectures entry)

    def layer(self, args, i: int) -> Sequence[TensorSpec]:
        return self.layer_tensors(self, args, i)
