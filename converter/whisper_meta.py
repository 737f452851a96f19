"""What a Whisper file carries beyond its tensors, from either source (ct2_source.py, a
Hugging Face directory through hf_source.py).

    runtime_config(config)  the HF WhisperConfig plus the fields every edgellm model has
                            (hidden_size, num_hidden_layers = decoder layers, ...)
    header(...)             the header's "whisper" entry: front end, special tokens,
                            languages, suppress lists, alignment heads (edgellm/transcribe.py
                            reads it)
    adapt_hf(source, root)  a Hugging Face Whisper directory as the packer wants it

Convolution weights [out, in, 3] are stored as matrices [out, in * 3] (column i * 3 + k),
so that the stem runs as a matrix product over unfolded frames on the same kernels as every
other linear layer. The output head is the token embedding (Whisper ties them): proj_out
is not stored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from edgellm.errors import SourceError

from .source import Source, SourceTensor

# openai/whisper's special tokens after <|notimestamps|> - k (tokenizer.py's layout)
_AFTER = {"translate": 5, "transcribe": 4, "sot_lm": 3, "sot_prev": 2, "no_speech": 1}
GENERATION_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
FRONT_END = {"feature_size": 80, "sampling_rate": 16000, "n_fft": 400, "hop_length": 160,
             "chunk_length": 30}


def runtime_config(config: dict) -> dict:
    """HF WhisperConfig fields + edgellm's common names (the decoder's sizes)."""
    c = dict(config)
    try:
        c.update(model_type="whisper", hidden_size=c["d_model"],
                 intermediate_size=c["decoder_ffn_dim"], num_hidden_layers=c["decoder_layers"],
                 num_attention_heads=c["decoder_attention_heads"],
                 max_position_embeddings=c["max_target_positions"], tie_word_embeddings=True,
                 num_key_value_heads=c["decoder_attention_heads"])
    except KeyError as e:
        raise SourceError(f"Whisper config field {e} is missing") from None
    c.pop("head_dim", None)
    return c


def _ids(value, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                              for i in value):
        raise SourceError(f"Whisper {what} is {value!r}: expected a list of token ids")
    return list(value)


def header(vocab_size: int, sot: int, eot: int, no_timestamps: int, languages: dict,
           suppress: list, begin_suppress: list, alignment_heads: list,
           front_end: dict | None = None, tasks: dict | None = None,
           max_initial_timestamp_index: int = 50) -> dict:
    """The header's "whisper" entry. languages: code -> token id (empty: English-only)."""
    fe = {**FRONT_END, **(front_end or {})}
    tokens = {"sot": sot, "eot": eot, "no_timestamps": no_timestamps,
              "timestamp_begin": no_timestamps + 1}
    tokens.update({k: no_timestamps - d for k, d in _AFTER.items()})
    tokens.update(tasks or {})
    for name, i in tokens.items():
        if not 0 <= i < vocab_size:
            raise SourceError(f"Whisper token {name} is {i}, outside the vocabulary "
                              f"(0..{vocab_size - 1})")
    return {
        "n_mels": int(fe["feature_size"]), "sampling_rate": int(fe["sampling_rate"]),
        "n_fft": int(fe["n_fft"]), "hop_length": int(fe["hop_length"]),
        "chunk_length": int(fe["chunk_length"]),
        "tokens": tokens, "timestamps": vocab_size - tokens["timestamp_begin"],
        "languages": {k: int(v) for k, v in languages.items()},
        "suppress_tokens": sorted(set(_ids(suppress, "suppress_tokens"))),
        "begin_suppress_tokens": _ids(begin_suppress, "begin_suppress_tokens"),
        "alignment_heads": [list(map(int, h)) for h in alignment_heads],
        "max_initial_timestamp_index": int(max_initial_timestamp_index),
    }


def conv_as_matrix(t: SourceTensor, name: str) -> SourceTensor:
    """A conv1d weight [out, in, k] as the matrix [out, in * k]."""
    out, cin, k = t.shape
    return SourceTensor(name, (out, cin * k), t.dtype,
                        lambda: np.ascontiguousarray(t.load()).reshape(out, cin * k))


def adapt_hf(source: Source, root: Path) -> Source:
    """A Hugging Face Whisper directory's Source as the packer takes it: the runtime
    config, the "whisper" header entry (generation_config.json, preprocessor_config.json),
    conv weights as matrices, no proj_out."""
    gen = source.generation_config
    if not gen.get("no_timestamps_token_id") or not gen.get("decoder_start_token_id"):
        raise SourceError(f"{root}: generation_config.json lacks Whisper's token ids "
                          "(no_timestamps_token_id, decoder_start_token_id)")
    pre = {}
    if (root / "preprocessor_config.json").is_file():
        pre = json.loads((root / "preprocessor_config.json").read_text("utf-8"))
    config = runtime_config(source.config)
    langs = {re.sub(r"^<\|(.*)\|>$", r"\1", k): v for k, v in
             (gen.get("lang_to_id") or {}).items()} if gen.get("is_multilingual") else {}
    eot = gen.get("eos_token_id")
    eot = eot[0] if isinstance(eot, list) else eot
    meta = header(config["vocab_size"], gen["decoder_start_token_id"], eot,
                  gen["no_timestamps_token_id"], langs, gen.get("suppress_tokens") or [],
                  gen.get("begin_suppress_tokens") or [], gen.get("alignment_heads") or [],
                  {k: pre[k] for k in FRONT_END if k in pre},
                  gen.get("task_to_id"), gen.get("max_initial_timestamp_index") or 50)
    inner = source.tensors

    def tensors():
        for t in inner():
            if t.name == "proj_out.weight":
                continue
            yield conv_as_matrix(t, t.name) if len(t.shape) == 3 else t

    return Source(source.path, config, tensors, source.tokenizer_json, source.tokenizer_config,
                  None, {k: gen[k] for k in GENERATION_KEYS if k in gen}, kind="hf",
                  whisper=meta)
