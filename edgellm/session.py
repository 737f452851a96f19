"""Sessions on disk: a model's token ids and KV cache as they stand (and a chat's messages),
saved to one file and mapped back in.

Layout (integers little-endian), as the model file's (format.py):
  0   8  magic b"EDGESESS"
  8   4  format version (u32)
  12  4  flags (u32, 0)
  16  8  header length in bytes (u64)
  24  32 sha256 of the header bytes
  56  8  reserved (0)
  64  .. header: UTF-8 JSON: the model's identity (its header's sha256 and file size), the
         cache's kv_type, context, per-layer slots/windows/write counts, next position,
         token ids, optional chat, and the three regions below with their crc32s
  ..     regions, each at a 64-byte boundary: K and V (every layer's [cap, n_kv, width]
         slots of the stored type, layer after layer; only written slots are written, the
         rest is a hole that reads as zeros), then the slot positions (int64 [cap] per layer)

Saving writes a temporary file beside the target and renames it over the target. Loading
checks everything (identity, cache type and context, sizes against the file length and
against the model's shapes, checksums) before it changes anything, then maps the K and V
regions copy-on-write (np.frombuffer over mmap.ACCESS_COPY) in place of the cache's own
arrays: nothing is copied, pages are read as attention touches them, and new tokens write
private pages. Any problem is a SessionError (one line) and the model stays as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import arguments, output_file
from .errors import ArgumentError, SessionError
from .kv_cache import CacheState
from .kv_types import KV_DTYPE

MAGIC = b"EDGESESS"
VERSION = 1
ALIGN = 64
PREAMBLE = struct.Struct("<8sIIQ32s8s")  # 64 bytes
MAX_HEADER_BYTES = 1 << 28


@dataclass
class Session:
    """A session file, read and checked: what `apply` puts into the model."""

    path: Path
    tokens: list[int]
    state: CacheState  # positions and counts (k/v: the live slots of the mapped regions)
    k: np.ndarray  # [slots, n_kv, width]: every layer's slots in order (KVCache.k_all)
    v: np.ndarray
    chat: dict | None = None
    messages: list[dict] = field(default_factory=list)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _has_cache(llm, path) -> None:
    if getattr(llm.model, "cache", None) is None:
        raise SessionError(f"{path}: {llm.packed.path.name} is an encoder: it keeps no KV cache "
                           "to save or load")


def model_identity(llm) -> dict:
    """What binds a session to a model file: its header's sha256 and its size."""
    packed = llm.packed
    digest = bytes(packed._mm[24:56]).hex() if packed._mm is not None else ""
    ident = {"header_sha256": digest, "file_size": int(packed.file_size)}
    if getattr(llm, "lora", None):  # the cache holds what these adapters computed
        ident["lora"] = [[str(p), float(s)] for p, s in llm.lora]
    return ident


def _layout(cache) -> dict:
    """The shapes a session of `cache` has: what a file must match, whatever it claims."""
    layer = cache.layers[0]
    n_kv, width = layer.k.shape[1], layer.k.shape[2]
    item = KV_DTYPE[cache.kv_type].itemsize
    slots = int(sum(int(c) for c in cache.caps))
    kv_bytes = slots * n_kv * width * item
    k_off = 0
    v_off = _align(kv_bytes)
    pos_off = v_off + _align(kv_bytes)
    return {"n_kv": n_kv, "width": width, "item": item, "kv_bytes": kv_bytes,
            "k_offset": k_off, "v_offset": v_off, "pos_offset": pos_off,
            "pos_bytes": slots * 8, "end": pos_off + slots * 8}


def _bytes(a: np.ndarray) -> memoryview:
    """An array's bytes without a copy (also for an empty array, which cast() refuses)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _crc(parts) -> int:
    """crc32 of arrays' bytes, one after another."""
    crc = 0
    for a in parts:
        crc = zlib.crc32(_bytes(a), crc)
    return crc


def _live(arrays, written, layers):
    """Each layer's written slots of per-layer arrays."""
    return [a[:min(int(wr), layer.cap)] for a, wr, layer in zip(arrays, written, layers)]


# saving -----------------------------------------------------------------------------
def save_session(llm, path: str | os.PathLike, chat: dict | None = None) -> Path:
    """Write the model's token ids and KV cache (and `chat`, JSON: messages etc.) to `path`,
    atomically. Returns the path. ArgumentError for a message load would refuse."""
    path = output_file.target(arguments.file_path(path, "session path"), SessionError)
    _has_cache(llm, path)
    for i, m in enumerate((chat or {}).get("messages", [])):
        if not _is_message(m):
            raise ArgumentError(f"messages[{i}] must be a dict with a str 'role' and a str, "
                                f"list or None 'content', got {m!r:.60}")
    model = llm.model
    cache = model.cache
    lay = _layout(cache)
    st = cache.state(copy=False)
    k_live = _live([layer.k for layer in cache.layers], st.written, cache.layers)
    v_live = _live([layer.v for layer in cache.layers], st.written, cache.layers)
    pos = np.concatenate([layer.pos for layer in cache.layers]).astype("<i8")
    header = {
        "model": model_identity(llm),
        "kv_type": cache.kv_type,
        "context": int(cache.context),
        "layers": [{"cap": int(c), "window": int(w), "written": int(wr)}
                   for c, w, wr in zip(cache.caps, cache.windows, st.written)],
        "n_kv": lay["n_kv"], "width": lay["width"],
        "next_pos": int(st.next_pos), "n_tokens": int(st.n_tokens),
        "tokens": [int(t) for t in model.tokens],
        "chat": chat,
        "regions": {"k": {"offset": lay["k_offset"], "nbytes": lay["kv_bytes"], "crc32": _crc(k_live)},
                    "v": {"offset": lay["v_offset"], "nbytes": lay["kv_bytes"], "crc32": _crc(v_live)},
                    "pos": {"offset": lay["pos_offset"], "nbytes": lay["pos_bytes"],
                            "crc32": zlib.crc32(pos.tobytes())}},
    }
    try:
        raw = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise SessionError(f"{path}: cannot save the chat: {e}") from None
    data_start = _align(PREAMBLE.size + len(raw))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(PREAMBLE.pack(MAGIC, VERSION, 0, len(raw), hashlib.sha256(raw).digest(),
                                  b"\0" * 8))
            f.write(raw)
            for parts, off in ((k_live, lay["k_offset"]), (v_live, lay["v_offset"])):
                start = data_start + off
                for layer, part in zip(cache.layers, parts):  # unwritten slots: a hole
                    f.seek(start)
                    f.write(_bytes(part))
                    start += layer.cap * lay["n_kv"] * lay["width"] * lay["item"]
            f.seek(data_start + lay["pos_offset"])
            f.write(pos.tobytes())
            f.truncate(data_start + lay["end"])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SessionError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    return path


# loading ----------------------------------------------------------------------------
def read_session(llm, path: str | os.PathLike) -> Session:
    """Read and check a session file for `llm` without changing the model."""
    path = arguments.file_path(path, "session path")
    where = str(path)
    _has_cache(llm, path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise SessionError(f"{where}: not a regular file")
        with open(path, "rb") as f:
            pre = f.read(PREAMBLE.size)
            if len(pre) < PREAMBLE.size:
                raise SessionError(f"{where}: file is truncated ({st.st_size} bytes): not an "
                                   "edgellm session file")
            magic, version, _flags, hlen, digest, _ = PREAMBLE.unpack(pre)
            if magic != MAGIC:
                raise SessionError(f"{where}: not an edgellm session file (magic {magic!r})")
            if version > VERSION:
                raise SessionError(f"{where}: written by a newer edgellm (session format "
                                   f"version {version}; this one reads {VERSION})")
            if version != VERSION:
                raise SessionError(f"{where}: session format version {version} is not "
                                   f"supported (this edgellm reads {VERSION})")
            if hlen > min(MAX_HEADER_BYTES, st.st_size - PREAMBLE.size):
                raise SessionError(f"{where}: header length {hlen} runs past the end of the "
                                   f"file ({st.st_size} bytes): truncated or corrupt")
            raw = f.read(hlen)
            if hashlib.sha256(raw).digest() != digest:
                raise SessionError(f"{where}: header checksum mismatch: file is corrupt")
            header = _json(where, raw)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if st.st_size else None
    except OSError as e:
        raise SessionError(f"{where}: cannot read: {e.strerror or e}") from None
    return _check(llm, where, header, mm, _align(PREAMBLE.size + hlen), st.st_size, path)


def _json(where: str, raw: bytes) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SessionError(f"{where}: header is not valid JSON: file is corrupt") from None
    if not isinstance(header, dict):
        raise SessionError(f"{where}: header is not a JSON object: file is corrupt")
    return header


def _field(where: str, obj, name: str, kind, lo: int | None = None, hi: int | None = None):
    """obj[name], checked to be of `kind` (ints: in lo..hi)."""
    v = obj.get(name) if isinstance(obj, dict) else None
    ok = isinstance(v, kind) and not isinstance(v, bool)
    if ok and kind is int:
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
    if not ok:
        raise SessionError(f"{where}: header field {name!r} is missing or invalid: "
                           "file is corrupt")
    return v


def _check(llm, where: str, header: dict, mm, data_start: int, size: int, path: Path) -> Session:
    model = llm.model
    cache = model.cache
    ident = model_identity(llm)
    saved = header.get("model")
    if isinstance(saved, dict) and saved.get("lora") != ident.get("lora"):
        raise SessionError(f"{where}: saved with LoRA adapters {saved.get('lora') or 'none'}, "
                           f"the model has {ident.get('lora') or 'none'} (load it with the "
                           "same --lora / set_lora)")
    if saved != ident:
        raise SessionError(f"{where}: made with another model file than "
                           f"{llm.packed.path.name} (its header checksum or size differs)")
    kv_type = _field(where, header, "kv_type", str)
    if kv_type != cache.kv_type:
        raise SessionError(f"{where}: its KV cache is {kv_type}, the model was loaded with "
                           f"kv_type {cache.kv_type} (use --kv-type {kv_type} / kv_type={kv_type!r})")
    context = _field(where, header, "context", int, 0)
    if context != cache.context:
        raise SessionError(f"{where}: saved at a context of {context} tokens, the model was "
                           f"loaded with {cache.context} (use --ctx {context} / context={context})")
    layers = header.get("layers")
    if not isinstance(layers, list) or len(layers) != len(cache.layers):
        raise SessionError(f"{where}: header field 'layers' does not match the model's "
                           f"{len(cache.layers)} layers: file is corrupt")
    lay = _layout(cache)
    n_tokens = _field(where, header, "n_tokens", int, 0, 1 << 40)
    next_pos = _field(where, header, "next_pos", int, 0, 1 << 40)
    written = []
    for e, layer in zip(layers, cache.layers):
        cap = _field(where, e, "cap", int)
        window = _field(where, e, "window", int)
        wr = _field(where, e, "written", int, 0, 1 << 40)
        if cap != layer.cap or window != layer.window or (not layer.window and wr > cap):
            raise SessionError(f"{where}: a layer's slots or window do not match the model's: "
                               "file is corrupt")
        if not layer.window and wr != n_tokens:
            raise SessionError(f"{where}: layer write counts disagree with the token count: "
                               "file is corrupt")
        written.append(wr)
    if n_tokens > next_pos:
        raise SessionError(f"{where}: more tokens than positions: file is corrupt")
    if _field(where, header, "n_kv", int) != lay["n_kv"] or \
            _field(where, header, "width", int) != lay["width"]:
        raise SessionError(f"{where}: its cache rows do not match the model's: file is corrupt")
    tokens = header.get("tokens")
    vocab = model.args.vocab_size
    if (not isinstance(tokens, list) or len(tokens) != n_tokens
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                       for t in tokens)):
        raise SessionError(f"{where}: header field 'tokens' is invalid: file is corrupt")
    chat = header.get("chat")
    if chat is not None and not isinstance(chat, dict):
        raise SessionError(f"{where}: header field 'chat' is invalid: file is corrupt")
    regions = header.get("regions")
    want = {"k": (lay["k_offset"], lay["kv_bytes"]), "v": (lay["v_offset"], lay["kv_bytes"]),
            "pos": (lay["pos_offset"], lay["pos_bytes"])}
    crcs = {}
    for name, (off, nbytes) in want.items():
        r = regions.get(name) if isinstance(regions, dict) else None
        if (_field(where, r, "offset", int) != off or _field(where, r, "nbytes", int) != nbytes):
            raise SessionError(f"{where}: region {name!r} does not have the size the model's "
                               "cache needs: file is corrupt")
        crcs[name] = _field(where, r, "crc32", int, 0, 0xFFFFFFFF)
    if mm is None or data_start + lay["end"] > size:
        raise SessionError(f"{where}: file is truncated ({size} bytes, the cache needs "
                           f"{data_start + lay['end']})")
    dtype = KV_DTYPE[kv_type]
    slots = int(sum(int(c) for c in cache.caps))
    count = slots * lay["n_kv"] * lay["width"]
    k_all = np.frombuffer(mm, dtype=dtype, count=count, offset=data_start + lay["k_offset"])
    v_all = np.frombuffer(mm, dtype=dtype, count=count, offset=data_start + lay["v_offset"])
    pos_all = np.frombuffer(mm, dtype="<i8", count=slots, offset=data_start + lay["pos_offset"])
    if zlib.crc32(pos_all.tobytes()) != crcs["pos"]:
        raise SessionError(f"{where}: checksum mismatch in the slot positions: file is corrupt")
    pos_all = np.array(pos_all, dtype=np.int64)
    if pos_all.size and (pos_all.min() < -1 or pos_all.max() >= max(next_pos, 1)):
        raise SessionError(f"{where}: slot positions out of range: file is corrupt")
    ks, vs, ps, start = [], [], [], 0
    per_slot = lay["n_kv"] * lay["width"]
    for layer in cache.layers:
        shape = (layer.cap, lay["n_kv"], lay["width"])
        ks.append(k_all[start * per_slot:(start + layer.cap) * per_slot].reshape(shape))
        vs.append(v_all[start * per_slot:(start + layer.cap) * per_slot].reshape(shape))
        ps.append(pos_all[start:start + layer.cap])
        start += layer.cap
    for name, arrays in (("k", ks), ("v", vs)):
        if _crc(_live(arrays, written, cache.layers)) != crcs[name]:
            raise SessionError(f"{where}: checksum mismatch in the {name.upper()} cache: "
                               "file is corrupt")
    shape = (slots, lay["n_kv"], lay["width"])
    k, v = k_all.reshape(shape), v_all.reshape(shape)
    state = CacheState(_live(ks, written, cache.layers), _live(vs, written, cache.layers),
                       _live(ps, written, cache.layers), written, next_pos, n_tokens)
    messages = _messages(where, chat)
    return Session(path, list(tokens), state, k, v, chat, messages)


def _messages(where: str, chat: dict | None) -> list[dict]:
    if chat is None:
        return []
    messages = chat.get("messages", [])
    if not isinstance(messages, list) or not all(_is_message(m) for m in messages):
        raise SessionError(f"{where}: the chat's messages are invalid: file is corrupt")
    return messages


def _is_message(m) -> bool:
    """A chat message as save_session writes and load takes it: a str role, and content a
    str, a list of parts or None (an assistant's tool calls)."""
    return isinstance(m, dict) and isinstance(m.get("role"), str) \
        and (m.get("content") is None or isinstance(m.get("content"), (str, list)))


def apply(llm, session: Session) -> None:
    """Put a checked session into the model: its arrays mapped in, its ids and positions."""
    model = llm.model
    model.cache.adopt(session.k, session.v, session.state)
    model.tokens[:] = session.tokens


def load_session(llm, path: str | os.PathLike) -> Session:
    """Read, check and apply a session file (SessionError, model unchanged, if it is bad)."""
    session = read_session(llm, path)
    apply(llm, session)
    return session
