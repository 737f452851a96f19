"""Which storage type each tensor gets, given the user's --quant choice.

Recipes (`--quant`):
  f32, f16            every matrix in that float type
  q8_0, q4_0, q4_1    every matrix (linear layers, embedding, output) in that block type
  q4_0_mixed          (default) q4_0 for the transformer's linear layers, q8_0 for the
                      embedding and output matrices, which are the most sensitive
  q4_1_mixed          the same with q4_1
  keep                (GGUF sources only, their default) each tensor stays in its source
                      type where edgellm has it; other types become q8_0
Vectors (norms, biases) and matrices whose columns do not split into blocks stay f32
(a matrix that cannot be blocked is stored f16 where a 4-bit or 8-bit type was asked).
"""

from __future__ import annotations

from edgellm import quant

RECIPES = ("q4_0_mixed", "q4_1_mixed", "q8_0", "q4_0", "q4_1", "f16", "f32", "keep")
DEFAULT_HF = "q4_0_mixed"
DEFAULT_GGUF = "keep"
SENSITIVE = ("embed_tokens.weight", "lm_head.weight")
# Small matrices read whole every token where quantization noise flips choices (MoE routers).
KEEP_F32 = ("mlp.gate.weight", "block_sparse_moe.gate.weight")


def choose_type(name: str, shape: tuple[int, ...], source_dtype: str, recipe: str,
                block_size: int) -> str:
    """The storage type of tensor `name` under `recipe`."""
    if len(shape) != 2 or name.endswith(KEEP_F32):
        return "f32"
    if recipe == "keep":
        wanted = source_dtype if source_dtype in quant.TYPES else "q8_0"
    elif recipe.endswith("_mixed"):
        wanted = "q8_0" if name.endswith(SENSITIVE) else recipe[: -len("_mixed")]
    else:
        wanted = recipe
    if quant.TYPES[wanted].quantized and shape[-1] % block_size:
        return "f16"
    return wanted
