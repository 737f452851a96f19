"""The packed model file: one self-describing, memory-mappable file.

Layout (all integers little-endian):
  0   8  magic b"EDGELLM\\0"
  8   4  format version (u32)
  12  4  flags (u32, 0)
  16  8  header length in bytes (u64)
  24  32 sha256 of the header bytes
  56  8  reserved (0)
  64  .. header: UTF-8 JSON object (see `build_header`)
  ..     tensor data; the data section starts at the first 64-byte boundary after the
         header, and each tensor's `offset` (relative to that start) is a multiple of 64.
         (version 2) The stored tokenizer comes first in the data section, the tensors
         after it: header field `tokenizer.stored` gives its place and kind
         (edgellm/modelfile/tokenizer_store.py).
Version 1 files keep the tokenizer.json text in the header (`tokenizer.json`); version 2
files may do either, and this reader reads both versions.
Quantized tensors are stored as `edgellm.modelfile.quant` describes (ggml block bytes, rows
contiguous); (version 3) a tensor entry's `layout` "x16" says its blocks are interleaved 16
rows a group instead (modelfile/layout.py: the same bytes rearranged). A file is written as
version 3 only where a tensor has a layout, so that an older reader refuses it rather than
misreading it; this reader reads versions 1 to 3. Opening checks the header checksum and
every offset and size against the file length, so it stays O(1) in the file size; `verify()`
checks per-tensor crc32s on demand.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError
from . import layout as layouts
from . import quant

MAGIC = b"EDGELLM\0"
VERSION = 2  # 2: the tokenizer may be stored in the data section (tokenizer.stored)
LAYOUT_VERSION = 3  # 3: tensors may have a layout (x16: layout.py)
READS_VERSIONS = (1, 2, 3)
ALIGN = 64
PREAMBLE = struct.Struct("<8sIIQ32s8s")  # 64 bytes
MAX_HEADER_BYTES = 1 << 30
MAX_TENSORS = 1_000_000
MAX_DIMS = 4


def align(n: int, a: int = ALIGN) -> int:
    """n rounded up to a multiple of a."""
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table; `offset` is relative to the data section."""

    name: str
    type: str
    shape: tuple[int, ...]
    block_size: int
    offset: int
    nbytes: int
    crc32: int = 0
    layout: str = layouts.ROWS  # x16: interleaved 16 rows a group (layout.py)

    def to_json(self) -> dict:
        e = {"type": self.type, "shape": list(self.shape), "block_size": self.block_size,
             "offset": self.offset, "nbytes": self.nbytes, "crc32": f"{self.crc32:08x}"}
        if self.layout:
            e["layout"] = self.layout
        return e


@dataclass(frozen=True)
class Tensor:
    """A zero-copy view of one stored tensor.

    `data` is float32/float16 of `shape` for float types, and uint8 [rows, row_bytes]
    for block-quantized ones; with layout "x16", uint8 [rows / 16, 16 * row_bytes]
    (layout.py), so that code reading rows refuses it by its shape.
    """

    name: str
    type: str
    shape: tuple[int, ...]
    block_size: int
    data: np.ndarray
    layout: str = layouts.ROWS

    def rows(self) -> np.ndarray:
        """The stored bytes as rows [rows, row_bytes] (a copy for x16: tests and tools)."""
        return layouts.rows_of(self.data, self.type, self.layout)

    def dequantize(self) -> np.ndarray:
        """float32 copy of the tensor (for tests and small tensors only)."""
        return quant.dequantize(self.rows(), self.type, self.shape, self.block_size)


def plan_tensors(entries: list[tuple], start: int = 0) -> list[TensorInfo]:
    """Lay out (name, type, shape, block_size[, layout]) entries back to back, 64-byte
    aligned, from offset `start` of the data section."""
    infos, offset = [], align(start)
    for name, type_name, shape, block_size, *layout in entries:
        nbytes = quant.qtype(type_name).nbytes(tuple(shape), block_size)
        infos.append(TensorInfo(name, type_name, tuple(int(s) for s in shape), block_size,
                                offset, nbytes, 0, layout[0] if layout else layouts.ROWS))
        offset = align(offset + nbytes)
    return infos


def encode_header(meta: dict, tensors: list[TensorInfo]) -> bytes:
    """The JSON header bytes: `meta` plus the tensor table (crc32 as fixed-width hex)."""
    header = dict(meta)
    header["tensors"] = {t.name: t.to_json() for t in tensors}
    return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def file_version(tensors: list[TensorInfo]) -> int:
    """The version a file of these tensors is written as: LAYOUT_VERSION where one has a
    layout (an older reader must refuse it), else VERSION."""
    return LAYOUT_VERSION if any(t.layout for t in tensors) else VERSION


def encode_preamble(header: bytes, version: int = VERSION) -> bytes:
    return PREAMBLE.pack(MAGIC, version, 0, len(header), hashlib.sha256(header).digest(),
                         b"\0" * 8)


class PackedModel:
    """An open packed file: header fields and zero-copy tensor views over one np.memmap."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        where = str(self.path)
        try:
            st = self.path.stat()
            if not stat.S_ISREG(st.st_mode):  # a FIFO would block, a device never end
                raise FormatError(f"{where}: not a regular file")
            size = st.st_size
            with open(self.path, "rb") as f:
                pre = f.read(PREAMBLE.size)
                if len(pre) < PREAMBLE.size:
                    raise FormatError(f"{where}: file is truncated ({size} bytes): "
                                      "not an edgellm model file")
                magic, version, _flags, hlen, digest, _ = PREAMBLE.unpack(pre)
                if magic != MAGIC:
                    raise FormatError(f"{where}: wrong magic {magic!r}: not an edgellm model "
                                      "file (convert it with convert-model)")
                if version not in READS_VERSIONS:
                    raise FormatError(f"{where}: format version {version} is not supported "
                                      f"(this edgellm reads versions "
                                      f"{', '.join(map(str, READS_VERSIONS))})")
                if hlen > min(MAX_HEADER_BYTES, size - PREAMBLE.size):
                    raise FormatError(f"{where}: header length {hlen} runs past the end of "
                                      f"the file ({size} bytes): file is truncated or corrupt")
                raw = f.read(hlen)
        except OSError as e:
            raise FormatError(f"{where}: cannot read: {e.strerror or e}") from None
        if hashlib.sha256(raw).digest() != digest:
            raise FormatError(f"{where}: header checksum mismatch: file is corrupt")
        header = _parse_json(where, raw)
        self.header = header
        self.version = version
        self.data_start = align(PREAMBLE.size + hlen)
        self.file_size = size
        self.tensors = _parse_table(where, header.get("tensors"), size - self.data_start)
        _check_fields(where, header)
        self.tokenizer_stored = _parse_stored(where, header, self.tensors,
                                              size - self.data_start)
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r") if size else None
        self._prefault = None  # runtime/prefault.py's thread, once prefault() started it

    # header fields -------------------------------------------------------------
    @property
    def config(self) -> dict:
        return self.header.get("config", {})

    @property
    def architecture(self) -> str:
        return str(self.header.get("architecture") or self.config.get("model_type", ""))

    @property
    def has_tokenizer(self) -> bool:
        return bool(self.tokenizer_stored or (self.header.get("tokenizer") or {}).get("json"))

    @property
    def tokenizer_json(self) -> str | None:
        """The tokenizer.json text: the header's, or (version 2) rebuilt from the stored
        tokenizer, which costs as much as building it (for tools and tests)."""
        inline = (self.header.get("tokenizer") or {}).get("json")
        if inline or not self.tokenizer_stored:
            return inline
        kind, raw = self.tokenizer_bytes()
        if kind == "json":
            return raw.decode("utf-8")
        from .tokenizer_store import build

        return build(kind, raw).to_str()

    def tokenizer_bytes(self) -> tuple[str, bytes]:
        """(kind, decompressed bytes) of the stored tokenizer (tokenizer_store.py's
        layout); FormatError if it is corrupt."""
        from .tokenizer_store import decompress

        st = self.tokenizer_stored
        start = self.data_start + st["offset"]
        blob = self._mm[start:start + st["nbytes"]]
        if zlib.crc32(blob) != st["crc32"]:
            raise FormatError(f"{self.path}: stored tokenizer checksum mismatch: file is corrupt")
        try:
            return st["kind"], decompress(blob, st["size"])
        except ValueError as e:
            raise FormatError(f"{self.path}: stored tokenizer {e}: file is corrupt") from None

    @property
    def tokenizer_config(self) -> dict:
        return (self.header.get("tokenizer") or {}).get("config") or {}

    @property
    def chat_template(self) -> str | None:
        return self.header.get("chat_template")

    @property
    def generation_config(self) -> dict:
        return self.header.get("generation_config", {})

    # tensors -------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> Tensor:
        """Zero-copy view of tensor `name`; FormatError if it is not in the file."""
        info = self.tensors.get(name)
        if info is None:
            raise FormatError(f"{self.path}: tensor {name} is missing")
        start = self.data_start + info.offset
        raw = self._mm[start:start + info.nbytes]
        t = quant.qtype(info.type)
        if t.quantized:
            data = raw.reshape(layouts.data_shape(info.type, info.shape, info.block_size,
                                                  info.layout))
        else:
            data = raw.view(quant.FLOAT_DTYPE[info.type]).reshape(info.shape)
        return Tensor(name, info.type, info.shape, info.block_size, data, info.layout)

    def verify(self) -> list[str]:
        """Check every tensor's crc32; return the names that do not match."""
        bad = []
        for info in self.tensors.values():
            start = self.data_start + info.offset
            if zlib.crc32(self._mm[start:start + info.nbytes]) != info.crc32:
                bad.append(info.name)
        return bad

    def prefault(self, arrays: list[np.ndarray]) -> None:
        """Map the pages of `arrays` (views of this file) into the process on a thread
        (runtime/prefault.py), ahead of the first token that reads them; close() stops it."""
        from ..runtime.prefault import Prefault, ranges

        if self._mm is None or self._prefault is not None:
            return
        lo = self._mm.ctypes.data
        hi = lo + self._mm.nbytes
        self._prefault = Prefault(ranges([a for a in arrays if lo <= a.ctypes.data
                                          and a.ctypes.data + a.nbytes <= hi]))

    def close(self) -> None:
        if self._prefault is not None:  # before the mapping goes: it maps pages of it
            self._prefault.stop()
        mm, self._mm = self._mm, None
        if mm is not None and getattr(mm, "_mmap", None) is not None:
            try:
                mm._mmap.close()
            except (BufferError, ValueError):
                pass  # views still alive: the mapping goes away with them

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"key {_name(key)} appears twice")
            seen.add(key)
    return out


def _parse_json(where: str, raw: bytes) -> dict:
    """The header object; duplicate keys (two tensors of one name) are refused."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise FormatError(f"{where}: header JSON is ambiguous: {e}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"{where}: header is not valid JSON: {e}") from None
    except RecursionError:
        raise FormatError(f"{where}: header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise FormatError(f"{where}: header is not a JSON object")
    return header


# header field -> the JSON types it may have (absent is always allowed)
HEADER_FIELDS = {"architecture": (str,), "config": (dict,), "generation_config": (dict,),
                 "chat_template": (str, type(None)), "tokenizer": (dict, type(None)),
                 "quantization": (dict,), "source": (dict,), "whisper": (dict,)}


def _check_fields(where: str, header: dict) -> None:
    """The non-tensor header fields have the types the runtime reads them as."""
    for key, types in HEADER_FIELDS.items():
        if key in header and not isinstance(header[key], types):
            want = " or ".join(_JSON[t] for t in types)
            raise FormatError(f"{where}: header field {key!r} is "
                              f"{type(header[key]).__name__}, expected {want}")
    tok = header.get("tokenizer") or {}
    if not isinstance(tok.get("json"), (str, type(None))):
        raise FormatError(f"{where}: header field tokenizer.json is not a string")
    if not isinstance(tok.get("config"), (dict, type(None))):
        raise FormatError(f"{where}: header field tokenizer.config is not an object")


_JSON = {str: "a string", dict: "an object", type(None): "null"}
MAX_TOKENIZER_BYTES = 1 << 30  # decompressed


def _parse_stored(where: str, header: dict, tensors: dict[str, TensorInfo],
                  data_bytes: int) -> dict | None:
    """tokenizer.stored: its kind, and a place in the data section that no tensor uses."""
    st = (header.get("tokenizer") or {}).get("stored")
    if st is None:
        return None
    from .tokenizer_store import KINDS

    name = "stored tokenizer"
    if not isinstance(st, dict) or st.get("kind") not in KINDS:
        raise FormatError(f"{where}: header field tokenizer.stored is {_short(st)}: expected an "
                          f"object with kind {' or '.join(KINDS)}")
    out = {"kind": st["kind"]}
    for field in ("offset", "nbytes", "size", "tokens", "merges"):
        v = st.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise FormatError(f"{where}: {name}: field {field!r} is {_short(v)}, expected an "
                              "integer >= 0")
        out[field] = v
    try:
        out["crc32"] = int(st.get("crc32"), 16)
    except (TypeError, ValueError):
        raise FormatError(f"{where}: {name}: field 'crc32' is {_short(st.get('crc32'))}") \
            from None
    start, end = out["offset"], out["offset"] + out["nbytes"]
    if start % ALIGN:
        raise FormatError(f"{where}: {name}: offset {start} is not {ALIGN}-byte aligned")
    if end > data_bytes:
        raise FormatError(f"{where}: {name}: data at {start}+{out['nbytes']} runs past the end "
                          "of the file (truncated?)")
    if out["size"] > MAX_TOKENIZER_BYTES:
        raise FormatError(f"{where}: {name}: size {out['size']} is too large")
    for t in tensors.values():
        if t.nbytes and start < t.offset + t.nbytes and t.offset < end:
            raise FormatError(f"{where}: {name} and tensor {t.name} overlap")
    return out


def _short(value, limit: int = 60) -> str:
    """repr of a header value, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _name(name) -> str:
    """A tensor name for a one-line message: control characters escaped, long names cut."""
    text = name if isinstance(name, str) else repr(name)
    if not text.isprintable():
        text = repr(text)[1:-1]
    return text if len(text) <= 200 else text[:200] + "..."


def _parse_table(where: str, table, data_bytes: int) -> dict[str, TensorInfo]:
    """Validate the tensor table against the data section's length."""
    if not isinstance(table, dict):
        raise FormatError(f"{where}: header field 'tensors' is not an object")
    if len(table) > MAX_TENSORS:
        raise FormatError(f"{where}: tensor table has {len(table)} entries")
    out: dict[str, TensorInfo] = {}
    for name, e in table.items():
        if not name or _name(name) != name:
            raise FormatError(f"{where}: tensor name {_name(name)!r} is empty, too long or has "
                              "control characters")
        out[name] = _parse_entry(where, name, e, data_bytes)
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in out.values() if t.nbytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise FormatError(f"{where}: tensors {a} and {b} overlap")
    return out


def _int(where: str, name: str, field: str, v, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise FormatError(f"{where}: tensor {name}: field {field!r} is {_short(v)}, "
                          f"expected an integer >= {lo}")
    return v


def _parse_entry(where: str, name: str, e, data_bytes: int) -> TensorInfo:
    if not isinstance(e, dict):
        raise FormatError(f"{where}: tensor {name}: entry is not an object")
    type_name = e.get("type")
    if not isinstance(type_name, str) or type_name not in quant.TYPES:
        raise FormatError(f"{where}: tensor {name}: unknown type {_short(type_name)}")
    shape = e.get("shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_DIMS:
        raise FormatError(f"{where}: tensor {name}: field 'shape' is {_short(shape)}")
    shape = tuple(_int(where, name, "shape", s, 1) for s in shape)
    if math.prod(shape) > 2 * max(data_bytes, 0) + 2:  # no type stores under 4 bits/element
        raise FormatError(f"{where}: tensor {name}: shape {list(shape)} does not fit in the "
                          f"file's {max(data_bytes, 0)} bytes of data")
    block = _int(where, name, "block_size", e.get("block_size", quant.DEFAULT_BLOCK), 1)
    t = quant.qtype(type_name)
    allowed = t.blocks if t.quantized else quant.BLOCK_SIZES  # floats too: kernels take it
    if block not in allowed:
        raise FormatError(f"{where}: tensor {name}: block_size {block} is not one of "
                          f"{list(allowed)}" + (f" for {type_name}" if t.quantized else ""))
    if t.quantized and (len(shape) != 2 or shape[-1] % block):
        raise FormatError(f"{where}: tensor {name}: shape {list(shape)} does not fit "
                          f"{type_name} blocks of {block}")
    offset = _int(where, name, "offset", e.get("offset"))
    nbytes = _int(where, name, "nbytes", e.get("nbytes"))
    if offset % ALIGN:
        raise FormatError(f"{where}: tensor {name}: offset {offset} is not {ALIGN}-byte aligned")
    if nbytes != t.nbytes(shape, block):
        raise FormatError(f"{where}: tensor {name}: nbytes {nbytes} does not match "
                          f"{type_name} {list(shape)}")
    if offset + nbytes > data_bytes:
        raise FormatError(f"{where}: tensor {name}: data at {offset}+{nbytes} runs past the "
                          "end of the file (truncated?)")
    crc = e.get("crc32", "0")
    try:
        crc = int(crc, 16) if isinstance(crc, str) else _int(where, name, "crc32", crc)
    except ValueError:
        raise FormatError(f"{where}: tensor {name}: field 'crc32' is {_short(crc)}") from None
    layout = e.get("layout", layouts.ROWS)
    if layout not in layouts.LAYOUTS:
        raise FormatError(f"{where}: tensor {name}: unknown layout {_short(layout)}")
    if layout == layouts.X16 and not layouts.fits_x16(type_name, shape, block):
        raise FormatError(f"{where}: tensor {name}: {type_name} {list(shape)} blocks of "
                          f"{block} cannot be in layout x16")
    return TensorInfo(name, type_name, shape, block, offset, nbytes, crc, layout)


def open_model(path: str | os.PathLike) -> PackedModel:
    """Open and validate a packed model file."""
    return PackedModel(path)
