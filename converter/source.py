"""What every conversion source (HF directory, GGUF file) hands to the packer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SourceTensor:
    """One tensor of a source, loaded lazily.

    name: edgellm's (= Hugging Face's) name, e.g. "model.layers.0.self_attn.q_proj.weight".
    shape: logical shape in Hugging Face orientation ([out, in] for linear weights).
    dtype: the source storage type: "f32", "f16", "bf16", or a ggml type name in lower case
      ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k", ...).
    load: returns the values as a float32 numpy array of `shape` (dequantizing if needed).
    load_raw: for sources whose bytes are already one of edgellm's block types ("q8_0",
      "q4_0", "q4_1", block 32, ggml layout): returns uint8 [rows, row_bytes] in edgellm's
      layout (rows already in Hugging Face order), so the packer copies them losslessly.
      None otherwise.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    load: Callable[[], np.ndarray]
    load_raw: Callable[[], np.ndarray] | None = None


@dataclass
class Source:
    """A model to convert: Hugging Face style metadata plus a lazy tensor iterator."""

    path: str
    config: dict  # config.json contents (model_type, architectures, sizes, rope, ...)
    tensors: Callable[[], Iterator[SourceTensor]]
    tokenizer_json: str | None = None  # tokenizer.json contents
    tokenizer_config: dict = field(default_factory=dict)
    chat_template: str | None = None
    generation_config: dict = field(default_factory=dict)
    kind: str = "hf"  # "hf", "gguf" or "ct2"
    embedding: dict | None = None  # pooling, normalize, max_seq_length (sentence_transformers.py)
    whisper: dict | None = None  # front end and decoding tokens (whisper_meta.py)
