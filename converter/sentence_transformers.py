"""Read a sentence-transformers directory's embedding configuration.

modules.json lists the modules applied in order: a Transformer (the Hugging Face model at
the module's path, "" = the directory itself), a Pooling (its path holds config.json),
optionally a Normalize. Both formats are read:

  current (sentence-transformers >= 5): types `sentence_transformers.base.modules.*` /
      `...modules.pooling.Pooling`, 1_Pooling/config.json {"pooling_mode": "mean", ...}
  older: types `sentence_transformers.models.*`, 1_Pooling/config.json with booleans
      {"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": false, ...}

max_seq_length comes from sentence_bert_config.json; when it is absent, as
sentence-transformers does: min(max_position_embeddings, tokenizer model_max_length).
A CrossEncoder directory (sentence-transformers >= 6) lists a Transformer alone and names
its activation in config_sentence_transformers.json: the converter keeps it in the config
as config.json's own "sentence_transformers"."activation_fn" (CrossEncoder 4-5's place).
The result is stored in the packed file's header as "embedding":
    {"pooling": "mean" | "cls" | "max" | "lasttoken" | "mean_sqrt_len_tokens" |
                "weightedmean", "normalize": bool, "max_seq_length": int | null}
"""

from __future__ import annotations

import json
from pathlib import Path

from edgellm.embed import POOLING_MODES
from edgellm.errors import SourceError

_OLD_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
             "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens":
             "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
             "pooling_mode_lasttoken": "lasttoken"}
_MODE_ALIASES = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max",
                 "weightedmean_tokens": "weightedmean", "last_token": "lasttoken"}


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SourceError(f"{path}: missing (modules.json names it)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SourceError(f"{path}: cannot read JSON: {e}") from None


def _kind(module_type: str) -> str:
    """'Transformer', 'Pooling', 'Normalize', ... from a module's dotted type name."""
    return module_type.rsplit(".", 1)[-1]


def _pooling_mode(path: Path) -> str:
    cfg = _json(path)
    if not isinstance(cfg, dict):
        raise SourceError(f"{path}: not a JSON object")
    if "pooling_mode" in cfg:  # current format
        mode = cfg["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else mode
        if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
            raise SourceError(f"{path}: field 'pooling_mode' is {mode!r}")
        modes = [_MODE_ALIASES.get(m, m) for m in modes]
    else:  # older format: one boolean per mode
        modes = [mode for key, mode in _OLD_KEYS.items() if cfg.get(key) is True]
    if len(modes) != 1:
        raise SourceError(f"{path}: pooling modes {modes or 'none'}: edgellm runs exactly one "
                          f"of {', '.join(POOLING_MODES)}")
    if modes[0] not in POOLING_MODES:
        raise SourceError(f"{path}: pooling mode {modes[0]!r} is not supported "
                          f"({', '.join(POOLING_MODES)})")
    return modes[0]


def read(root: Path) -> tuple[Path, dict] | None:
    """(directory of the Hugging Face model, embedding config) of a sentence-transformers
    directory, or None when `root` has no modules.json; the embedding config is None for a
    CrossEncoder (a Transformer alone). max_seq_length is None unless
    sentence_bert_config.json sets it (see default_length)."""
    modules_path = root / "modules.json"
    if not modules_path.exists():
        return None
    modules = _json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise SourceError(f"{modules_path}: not a list of modules")
    model_dir, pooling, normalize = None, None, False
    for m in modules:
        kind, path = _kind(str(m.get("type", ""))), str(m.get("path", ""))
        if ".." in Path(path).parts or Path(path).is_absolute():
            raise SourceError(f"{modules_path}: module path {path!r} leaves the directory")
        if kind == "Transformer" and model_dir is None:
            model_dir = root / path
        elif kind == "Pooling" and pooling is None and model_dir is not None:
            pooling = _pooling_mode(root / path / "config.json")
        elif kind == "Normalize" and pooling is not None:
            normalize = True
        else:
            after = "Normalize" if normalize else "Pooling" if pooling else "the start"
            raise SourceError(f"{modules_path}: module {m.get('type')!r} (after {after}) is "
                              "not supported: edgellm runs Transformer, Pooling, Normalize")
    if model_dir is not None and len(modules) == 1:  # a CrossEncoder (>= 6): no pooling
        return model_dir, None
    if model_dir is None or pooling is None:
        raise SourceError(f"{modules_path}: needs a Transformer and a Pooling module")
    st = root / "sentence_bert_config.json"
    st_config = _json(st) if st.exists() else {}
    max_len = st_config.get("max_seq_length") if isinstance(st_config, dict) else None
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)
                                or max_len < 2):
        raise SourceError(f"{st}: field 'max_seq_length' is {max_len!r}")
    return model_dir, {"pooling": pooling, "normalize": normalize, "max_seq_length": max_len}


def cross_encoder_activation(root: Path) -> str | None:
    """The activation a CrossEncoder directory names in config_sentence_transformers.json
    ("torch.nn.modules.activation.Sigmoid", ...), or None."""
    path = root / "config_sentence_transformers.json"
    cfg = _json(path) if path.is_file() else None
    if not isinstance(cfg, dict) or cfg.get("model_type") != "CrossEncoder":
        return None
    fn = cfg.get("activation_fn")
    if fn is not None and not isinstance(fn, str):
        raise SourceError(f"{path}: field 'activation_fn' is {fn!r:.60}")
    return fn


def default_length(embedding: dict, config: dict, tokenizer_config: dict) -> dict:
    """`embedding` with max_seq_length set as sentence-transformers sets it when
    sentence_bert_config.json does not: min(max_position_embeddings, model_max_length)."""
    if embedding.get("max_seq_length") is not None:
        return embedding
    limits = [v for v in (config.get("max_position_embeddings"),
                          tokenizer_config.get("model_max_length"))
              if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return {**embedding, "max_seq_length": min(limits) if limits else None}
