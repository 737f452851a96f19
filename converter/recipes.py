"""Which storage type each tensor gets, given the user's --quant choice.

Recipes (`--quant`):
  f32, f16            every matrix in that float type
  q8_0, q4_0, q4_1    every matrix (linear layers, embedding, output) in that block type
  q4_0_mixed          (default) q4_0 for the transformer's linear layers, q8_0 for the
                      embedding and output matrices, which are the most sensitive
  q4_1_mixed          the same with q4_1
  q4_0_best           q4_0 with the searched quantizer (converter/quantizers.py: per-block
                      scales that minimize the weighted squared error, weighted by activation
                      statistics with --calibrate TEXT); q8_0 for the embedding and output
                      matrices, v_proj in every layer and down_proj in the first and last
                      layers: per byte the most sensitive matrices (measured on SmolLM2)
  q4_1_best           the same with q4_1
  keep                (GGUF sources only, their default) each tensor stays in its source
                      type where edgellm has it, K-quants and q5_0/q5_1 included (the
                      publisher's exact bytes); others q8_0
  auto                (GGUF sources only) each tensor stays in its source type where
                      edgellm has sized-block kernels for it (q8_0, q4_0, q4_1, floats);
                      K-quants and q5_0/q5_1 become q8_0 (before their integer-activation
                      kernels, kernels/kquant_int.py, they decoded far slower than q8_0)
  q4_k_m, q5_k_m      llama.cpp's mixes from a float source, with llama-quantize's per-tensor
  (and q6_k)          choices (no importance matrix): the output matrix (and a tied
                      embedding) q6_k, v_proj and down_proj q6_k in use_more_bits layers, the
                      rest q4_k / q5_k; a matrix whose columns do not split into 256 falls back
                      as llama.cpp's does (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0,
                      q2_k/q3_k -> q4_0)
Instead of a recipe, --target-size 80MB / --target-bpw 4.5 (converter/size_target.py) give
each matrix q4_0, q4_1 or q8_0 by its measured sensitivity so that the file meets the budget.
The plain recipes use llama.cpp's reference rounding (edgellm.modelfile.quant), bit for bit, unless
convert-model is given --quantizer search; the *_best recipes and --target-size always search.
--quantizer gptq (with --calibrate) keeps the searched scales and rounds the codes with GPTQ's
error feedback (converter/gptq.py), which minimizes each layer's output error instead.
Vectors (norms, biases) and matrices whose columns do not split into blocks stay f32
(a matrix that cannot be blocked is stored f16 where a 4-bit or 8-bit type was asked).
"""

from __future__ import annotations

from edgellm.modelfile import quant

# every type of quant.TYPES is a recipe of its own
K_MIXES = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}  # llama.cpp's _M mixes and their base type
RECIPES = ("q4_0_mixed", "q4_1_mixed", "q4_0_best", "q4_1_best", *quant.QUANTIZED,
           *quant.FLOAT_TYPES, "auto", "keep", *K_MIXES)
SEARCHED = ("q4_0_best", "q4_1_best")  # recipes that always use the searched quantizer
# what --target-size / --target-bpw choose from by default: every type with int8 kernels
TARGET_TYPES = tuple(sorted(t for t in quant.INT8_TYPES if t not in quant.K_TYPES))
K_REPORTED = (*K_MIXES, "q6_k")  # recipes whose summary lists each tensor's type
# llama-quantize's fallback for a matrix whose columns do not split into its blocks
K_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "q2_k": "q4_0", "q3_k": "q4_0"}
DEFAULT_HF = "q4_0_mixed"
DEFAULT_GGUF = "keep"
SENSITIVE = ("embed_tokens.weight", "lm_head.weight", "word_embeddings.weight",
             "position_embeddings.weight", "token_type_embeddings.weight")
# Small matrices read whole every token where quantization noise flips choices (MoE routers).
# Whisper's position tables: added to every frame, small, not run through a kernel.
KEEP_F32 = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "embed_positions.weight")
# Kept at q8_0 by the *_best recipes (llama.cpp's Q4_K_M gives them more bits too): per byte,
# q4_0 noise costs SmolLM2 the most there (converter/size_target.py's KL measurement).
BEST_Q8 = ("self_attn.v_proj.weight",)  # in every layer
BEST_Q8_EDGE = ("mlp.down_proj.weight",)  # in the first and last layers


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return int(parts[2])
    return None


def k_mix_type(name: str, recipe: str, n_layers: int, tied: bool) -> str:
    """llama_tensor_get_type's choice for an HF tensor under q4_k_m / q5_k_m / q6_k (before
    the fallback for incompatible shapes)."""
    base = K_MIXES.get(recipe, recipe)
    if name == "lm_head.weight" or (tied and name.endswith("embed_tokens.weight")):
        return "q6_k"
    i = _layer(name)
    if recipe in K_MIXES and i is not None and n_layers and _use_more_bits(i, n_layers) \
            and name.endswith(("self_attn.v_proj.weight", "mlp.down_proj.weight")):
        return "q6_k"
    return base


def choose_type(name: str, shape: tuple[int, ...], source_dtype: str, recipe: str,
                block_size: int, n_layers: int = 0, tied: bool = False) -> str:
    """The storage type of tensor `name` under `recipe` (n_layers: the model's layer count,
    for the *_best and K recipes; tied: the output matrix is the embedding)."""
    if len(shape) != 2 or name.endswith(KEEP_F32):
        return "f32"
    if recipe in K_MIXES or recipe == "q6_k":
        wanted = k_mix_type(name, recipe, n_layers, tied)
    elif recipe == "keep":
        wanted = source_dtype if source_dtype in quant.TYPES else "q8_0"
    elif recipe == "auto":
        wanted = (source_dtype if source_dtype in quant.TYPES
                  and source_dtype not in quant.K_TYPES else "q8_0")
    elif recipe.endswith("_mixed"):
        wanted = "q8_0" if name.endswith(SENSITIVE) else recipe[: -len("_mixed")]
    elif recipe.endswith("_best"):
        edge = any(name == f"model.layers.{i}.{s}" for i in {0, n_layers - 1} if i >= 0
                   for s in BEST_Q8_EDGE)
        wanted = "q8_0" if name.endswith(SENSITIVE + BEST_Q8) or edge \
            else recipe[: -len("_best")]
    else:
        wanted = recipe
    t = quant.TYPES[wanted]
    if t.quantized and shape[-1] % t.block_for(block_size) and wanted in K_FALLBACK:
        wanted = K_FALLBACK[wanted]
        t = quant.TYPES[wanted]
    if t.quantized and shape[-1] % t.block_for(block_size):
        return "f16"
    return wanted
