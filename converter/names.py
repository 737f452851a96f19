"""Source tensor names -> edgellm names (Hugging Face's causal-LM names, one place)."""

from __future__ import annotations

import re

from edgellm.arch.bert import task
from edgellm.errors import SourceError

# Buffers some checkpoints save that are recomputed at run time.
_SKIP_SUFFIXES = ("rotary_emb.inv_freq", ".attn.masked_bias", ".attn.bias",
                  "embeddings.position_ids", "embeddings.token_type_ids")
# Wrappers around the text model in multimodal or older checkpoints.
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))
# A decoder saved as its base model (sentence-transformers' Qwen3-Embedding layout): no
# "model." prefix.
_BARE_DECODER = ("layers.", "embed_tokens.", "norm.")
# Encoders: the base model's names without the task wrapper's prefix; heads not needed.
ENCODERS = ("bert", "roberta", "xlm-roberta")
_ENCODER_PREFIXES = ("bert.", "roberta.")
_ENCODER_HEADS = ("pooler.", "cls.", "lm_head.", "classifier.", "qa_outputs.")
_CLASSIFIER_HEADS = ("pooler.", "classifier.")  # kept for *ForSequence/TokenClassification
# transformers 5's in-memory layout: all experts of a layer stacked in one 3-D parameter.
_STACKED = re.compile(r"model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|gate_proj|up_proj|"
                      r"down_proj)(\.weight)?")


def sanitize(name: str, config: dict) -> str | None:
    """edgellm's name for source tensor `name`, or None when the tensor is not needed."""
    if name.endswith(_SKIP_SUFFIXES):
        return None
    if config.get("model_type") in ENCODERS:
        for prefix in _ENCODER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        if name.startswith(_CLASSIFIER_HEADS) and task(config):  # arch/bert.py runs it
            return name
        return None if name.startswith(_ENCODER_HEADS) else name
    if name.startswith(_BARE_DECODER):
        name = "model." + name
    for old, new in _PREFIXES:
        if name.startswith(old):
            name = new + name[len(old):]
    if name == "lm_head.weight" and config.get("tie_word_embeddings"):
        return None  # tied: the runtime reads the embedding matrix instead
    if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision")):
        return None
    if _STACKED.fullmatch(name):
        raise SourceError(f"tensor {name}: experts stacked in one tensor are not supported; "
                          "use a checkpoint with one tensor per expert (as save_pretrained "
                          "writes them)")
    return name
