"""GGUF file -> Source: HF config, rebuilt tokenizer, and lazy HF-named tensors.

Tensors stay in the GGUFReader's memory map until asked for, so converting holds about one
tensor in memory. Quantized tensors whose bytes are one of edgellm's block types (q8_0,
q4_0, q4_1 at block 32: ggml's own layout) are handed over as raw rows, losslessly; every
other type is dequantized with gguf.quants. llama.cpp's Q/K row permutation (llama, mistral)
is undone on rows, so it applies alike to float values and to quantized byte rows.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterator
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from edgellm.errors import EdgeLLMError, SourceError, UnsupportedArchitectureError
from edgellm.modelfile import quant

from . import gguf_names
from .gguf_tokenizer import build_tokenizer
from .source import Source, SourceTensor

# What a malformed file makes the gguf package (or numpy under it) raise.
_MALFORMED = (ValueError, KeyError, IndexError, TypeError, OverflowError, AssertionError,
              UnicodeDecodeError, struct.error, NotImplementedError, MemoryError)
# ggml types edgellm stores as they are (quant.TYPES: each row names its ggml type)
_FLOAT_TYPES = {QT[t.ggml]: t.name for t in quant.TYPES.values() if not t.quantized}
_RAW_TYPES = {QT[t.ggml]: t.name for t in quant.TYPES.values() if t.quantized}


class _StrictReader(gguf.GGUFReader):
    """GGUFReader that refuses reads past the end of the file.

    The stock reader slices its memmap, so reading past the end yields short (often empty)
    arrays: a truncated or corrupt header can then spin through a huge array count reading
    nothing. Checking every read's length turns that into an error at once.
    """

    def _get(self, offset: int, dtype: Any, count: int = 1,
             override_order: Any = None) -> np.ndarray:
        arr = super()._get(offset, dtype, count, override_order)
        if len(arr) != int(count):
            raise ValueError(f"reading {int(count)} items at offset {offset} runs past the end "
                             "of the file")
        return arr

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        # The stock reader adds the offsets in uint64 (2**64 - 1 wraps around to the byte
        # before the data) and multiplies the dims in numpy: check them exactly first.
        size = len(self.data)
        for field in fields:
            _, name, _, dims, _, offset = field.parts
            name = bytes(name).decode("utf-8", "replace")
            rel, n = int(offset[0]), math.prod(int(d) for d in dims)
            if start_offs + rel > size or n > 8 * size:
                raise ValueError(f"tensor {name}: {n} elements at data offset {rel} lie beyond "
                                 f"the file's {size} bytes")
            if rel % int(getattr(self, "alignment", 32) or 1):
                raise ValueError(f"tensor {name}: data offset {rel} is not aligned")
        super()._build_tensors(start_offs, fields)


def open_gguf(path: str | os.PathLike) -> Source:
    """Open a GGUF file as a conversion Source (SourceError / UnsupportedArchitectureError)."""
    path = os.fspath(path)
    reader = _open_reader(path)
    meta = _metadata(path, reader)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise SourceError(f"{path}: metadata field general.architecture is missing")
    try:
        gguf_names.model_type(arch)  # UnsupportedArchitectureError before anything else
    except UnsupportedArchitectureError as e:
        raise UnsupportedArchitectureError(f"{path}: {e}") from None
    infos = _guarded(path, "tensor table", lambda: [_TensorInfo(path, arch, t)
                                                    for t in reader.tensors])
    by_name = {i.gguf_name: i for i in infos}
    shapes = {i.gguf_name: i.shape for i in infos}
    freqs = by_name["rope_freqs.weight"].load() if "rope_freqs.weight" in by_name else None
    config = gguf_names.hf_config(meta, shapes, path, freqs)
    for info in infos:
        info.bind(config)
    tokenizer_json, tokenizer_config = build_tokenizer(meta, path)

    def tensors() -> Iterator[SourceTensor]:
        for info in infos:
            if info.hf_name is not None:
                yield info.source_tensor()

    return Source(
        path=path,
        config=config,
        tensors=tensors,
        tokenizer_json=tokenizer_json,
        tokenizer_config=tokenizer_config,
        chat_template=tokenizer_config.get("chat_template"),
        generation_config=_generation_config(meta, config),
        kind="gguf",
    )


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """A GGUF file's metadata as {key: Python value} (SourceError if malformed)."""
    path = os.fspath(path)
    return _metadata(path, _open_reader(path))


def _metadata(path: str, reader: gguf.GGUFReader) -> dict[str, Any]:
    return _guarded(path, "metadata", lambda: {
        name: _field_value(field) for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    })


def _open_reader(path: str) -> gguf.GGUFReader:
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise SourceError(f"{path}: not a file")
    try:
        if os.path.getsize(path) < 24:
            raise SourceError(f"{path}: not a GGUF file (too short for a header)")
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise SourceError(f"{path}: not a GGUF file (bad magic)")
    reader = _guarded(path, "header", lambda: _StrictReader(path))
    if reader.byte_order != "I":
        raise SourceError(f"{path}: big-endian GGUF files are not supported")
    return reader


def _guarded(path: str, what: str, fn: Callable[[], Any]) -> Any:
    """fn(), with the gguf package's assorted exceptions turned into one-line SourceErrors."""
    try:
        return fn()
    except EdgeLLMError:
        raise
    except OSError as e:
        raise SourceError(f"{path}: cannot read {what}: {e.strerror or e}") from e
    except _MALFORMED as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        raise SourceError(f"{path}: malformed GGUF {what}: {msg}") from e


def _field_value(field: Any) -> Any:
    """A metadata field as a Python value: scalar, str, or list (strings decoded leniently)."""
    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) > 1 and types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        if len(types) > 1 and types[-1] == gguf.GGUFValueType.ARRAY:
            raise ValueError(f"field {field.name}: nested arrays are not supported")
        return [v for i in field.data for v in field.parts[i].tolist()]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    return field.parts[-1].tolist()[0]


_dequantizable: dict[QT, bool] = {}


def _can_dequantize(qtype: QT) -> bool:
    """Whether gguf.quants knows qtype (asked once per type, on one zero block)."""
    if qtype not in _dequantizable:
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
            _dequantizable[qtype] = True
        except (NotImplementedError, ValueError, KeyError):
            _dequantizable[qtype] = False
    return _dequantizable[qtype]


class _TensorInfo:
    """One GGUF tensor: its HF name, shape and dtype, and how to load it."""

    def __init__(self, path: str, arch: str, t: Any):
        self.path, self.arch, self.t = path, arch, t
        self.gguf_name = t.name
        self.qtype = QT(t.tensor_type)
        # GGUF lists dims innermost first (ne0 = the contiguous one): HF order is reversed.
        self.shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if not 1 <= len(self.shape) <= 4 or min(self.shape) <= 0:
            raise ValueError(f"tensor {t.name} has shape {list(self.shape)}")
        self.dtype = _FLOAT_TYPES.get(self.qtype) or _RAW_TYPES.get(self.qtype) \
            or self.qtype.name.lower()
        self.hf_name = None
        if t.name not in gguf_names.SKIPPED_TENSORS:
            self.hf_name = gguf_names.hf_tensor_name(arch, t.name)
            if self.hf_name is None:
                raise SourceError(f"{path}: tensor {t.name} is not part of a {arch} model")
            if self.qtype not in _FLOAT_TYPES and not _can_dequantize(self.qtype):
                raise SourceError(f"{path}: tensor {t.name} has type {self.qtype.name}, "
                                  "which cannot be dequantized")
        self.order: np.ndarray | None = None
        self.offset = gguf_names.value_offset(arch, t.name)  # Gemma's norms: stored + 1

    def bind(self, config: dict) -> None:
        """Fix the Q/K row order once the head counts are known."""
        heads = gguf_names.qk_heads(self.arch, self.gguf_name, config)
        if heads is not None:
            try:
                self.order = gguf_names.unpermute_order(self.shape[0], heads)
            except ValueError as e:
                raise SourceError(f"{self.path}: tensor {self.gguf_name}: {e}") from None

    def rows(self) -> np.ndarray:
        """The stored data as [rows, row items] (uint8 bytes for block types), HF row order."""
        data = self.t.data.reshape(-1, self.t.data.shape[-1]) if self.t.data.ndim > 1 \
            else self.t.data.reshape(1, -1)
        if self.order is not None:
            data = data.reshape(self.shape[0], -1)[self.order]
        return data

    def load(self) -> np.ndarray:
        """float32 values in HF shape and row order."""
        def run() -> np.ndarray:
            rows = self.rows()
            if self.qtype in _FLOAT_TYPES:
                out = rows.astype(np.float32)
            elif self.qtype in _RAW_TYPES and len(self.shape) == 2:
                out = quant.dequantize(rows, self.dtype, self.shape)
            else:
                out = gguf.quants.dequantize(np.ascontiguousarray(rows), self.qtype)
            out = np.ascontiguousarray(out, dtype=np.float32).reshape(self.shape)
            return out + np.float32(self.offset) if self.offset else out
        return _guarded(self.path, f"tensor {self.gguf_name}", run)

    def load_raw(self) -> np.ndarray:
        """uint8 [rows, row_bytes] in ggml's (= edgellm's) block layout, HF row order.

        Unpermuted tensors come as a read-only view of the file's memory map (no copy).
        """
        return _guarded(self.path, f"tensor {self.gguf_name}",
                        lambda: np.asarray(self.rows(), dtype=np.uint8).reshape(self.shape[0], -1))

    def source_tensor(self) -> SourceTensor:
        raw = self.qtype in _RAW_TYPES and len(self.shape) == 2 and not self.offset
        return SourceTensor(name=self.hf_name, shape=self.shape, dtype=self.dtype,
                            load=self.load, load_raw=self.load_raw if raw else None)


def _generation_config(meta: dict, config: dict) -> dict:
    """bos/eos/pad ids; eos lists the end-of-turn tokens too when the file names them."""
    out = {k: config[k] for k in ("bos_token_id", "pad_token_id") if k in config}
    eos = [config["eos_token_id"]] if "eos_token_id" in config else []
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value not in eos:
            eos.append(value)
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return out
