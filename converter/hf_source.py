"""Read a Hugging Face model directory: config, safetensors shards, tokenizer files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors import safe_open

from edgellm.errors import SourceError, TokenizerError
from edgellm.runtime.guard import native
from edgellm.text.tokenizer import Tokenizer

from . import sentence_transformers
from .names import sanitize
from .source import Source, SourceTensor

_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def _one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message as one line (library messages quote the file's bytes)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _read_text(path: Path) -> str | None:
    """A text file's contents, or None if there is no such file."""
    if not path.exists():
        return None
    if not path.is_file():  # a directory, or a FIFO that would block
        raise SourceError(f"{path}: not a regular file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None


def _read_json(path: Path, required: bool = False) -> dict:
    text = _read_text(path)
    if text is None:
        if required:
            raise SourceError(f"{path}: missing")
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise SourceError(f"{path}: cannot read JSON: {e}") from None
    except RecursionError:
        raise SourceError(f"{path}: cannot read JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path}: not a JSON object")
    return value


def _shard_files(root: Path) -> list[Path]:
    """The safetensors files of the model, in index order when there is an index."""
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SourceError(f"{index}: field 'weight_map' is missing or empty")
        files = []
        for name in weight_map.values():
            if not isinstance(name, str) or "/" in name or name.startswith("."):
                raise SourceError(f"{index}: bad shard name {name!r}")
            if name not in files:
                files.append(name)
        paths = [root / f for f in files]
        for p in paths:
            if not p.exists():
                raise SourceError(f"{index}: shard {p.name} is missing")
        return paths
    paths = sorted(root.glob("*.safetensors"))
    if not paths:
        raise SourceError(f"{root}: no *.safetensors files")
    return paths


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 (exact)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _lazy_tensor(path: Path, name: str) -> SourceTensor:
    with safe_open(path, framework="numpy") as f:
        sl = f.get_slice(name)
        dtype = sl.get_dtype()
        shape = tuple(sl.get_shape())
    if dtype not in _DTYPES:
        raise SourceError(f"{path}: tensor {name} has dtype {dtype} (supported: F32, F16, BF16)")

    def load() -> np.ndarray:
        try:
            if dtype == "BF16":
                return _bf16_to_f32(_read_bf16(path, name, shape))
            with safe_open(path, framework="numpy") as f:
                return np.asarray(f.get_tensor(name), dtype=np.float32)
        except Exception as e:  # safetensors raises its own error types too
            raise SourceError(f"{path}: cannot read tensor {name}: {_one_line(e)}") from None

    return SourceTensor(name, shape, _DTYPES[dtype], load)


def _read_bf16(path: Path, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bf16 bits of one tensor (numpy has no bfloat16): parsed from the file header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        start, end = header[name]["data_offsets"]
        f.seek(8 + n + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    return raw.reshape(shape)


def _tensor_names(path: Path) -> list[str]:
    # safetensors' own messages mislead here (it reports an unreadable file as missing),
    # and opening a FIFO would block in native code, out of reach of Ctrl-C.
    if not path.is_file():
        raise SourceError(f"{path}: not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        with safe_open(path, framework="numpy") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise SourceError(f"{path}: not a readable safetensors file: {_one_line(e)}") from None


def open_hf(path: str | Path) -> Source:
    """A Source over a Hugging Face model directory."""
    root = Path(path)
    if not root.is_dir():
        raise SourceError(f"{root}: not a directory")
    st = sentence_transformers.read(root)  # (model directory, embedding config) or None
    top, root = root, (st[0] if st else root)
    config = _read_json(root / "config.json", required=True)
    activation = sentence_transformers.cross_encoder_activation(top)
    if activation is not None:  # edgellm/heads.py reads it where CrossEncoder 4-5 kept it
        kept = config.get("sentence_transformers")
        config = {**config, "sentence_transformers": {
            **(kept if isinstance(kept, dict) else {}), "activation_fn": activation}}
    shards = _shard_files(root)
    names: dict[str, Path] = {}
    for shard in shards:
        for name in _tensor_names(shard):
            if name in names:
                raise SourceError(f"{shard}: tensor {name} also appears in {names[name].name}")
            names[name] = shard

    def tensors() -> Iterator[SourceTensor]:
        for name, shard in names.items():
            try:  # skip what the packer drops (BERT's int64 position_ids buffer)
                if sanitize(name, config) is None:
                    continue
            except SourceError:
                pass  # the packer reports it, naming the file
            try:
                yield _lazy_tensor(shard, name)
            except SourceError:
                raise
            except Exception as e:
                raise SourceError(f"{shard}: tensor {name}: {_one_line(e)}") from None

    tokenizer_json = _read_text(root / "tokenizer.json")
    tokenizer_config = _read_json(root / "tokenizer_config.json")
    generation_config = _read_json(root / "generation_config.json")
    if tokenizer_json is not None:  # refused now rather than by the runtime, later
        try:
            native(Tokenizer.from_json, tokenizer_json, tokenizer_config, generation_config,
                   error=lambda m: TokenizerError(f"invalid: {m}"))
        except TokenizerError as e:
            raise SourceError(f"{root / 'tokenizer.json'}: {e}") from None
    chat_template = _read_text(root / "chat_template.jinja")
    if chat_template is None:
        chat_template = tokenizer_config.get("chat_template")
    if isinstance(chat_template, list):  # named templates: keep the default one
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        chat_template = named.get("default")
    embedding = sentence_transformers.default_length(st[1], config, tokenizer_config) \
        if st and st[1] else None
    source = Source(str(top), config, tensors, tokenizer_json, tokenizer_config,
                    chat_template if isinstance(chat_template, str) else None,
                    generation_config, kind="hf", embedding=embedding)
    if config.get("model_type") == "whisper":
        from .whisper_meta import adapt_hf

        return adapt_hf(source, root)
    return source
