"""Source tensor names -> edgellm names (Hugging Face's causal-LM names, one place)."""

from __future__ import annotations

# Buffers some checkpoints save that are recomputed at run time.
_SKIP_SUFFIXES = ("rotary_emb.inv_freq", ".attn.masked_bias", ".attn.bias")
# Wrappers around the text model in multimodal or older checkpoints.
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))


def sanitize(name: str, config: dict) -> str | None:
    """edgellm's name for source tensor `name`, or None when the tensor is not needed."""
    if name.endswith(_SKIP_SUFFIXES):
        return None
    for old, new in _PREFIXES:
        if name.startswith(old):
            name = new + name[len(old):]
    if name == "lm_head.weight" and config.get("tie_word_embeddings"):
        return None  # tied: the runtime reads the embedding matrix instead
    if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision")):
        return None
    return name
