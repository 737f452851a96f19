"""Sessions on disk: a model's token ids and KV cache as they stand (and a chat's messages),
saved to one file and read back in.

Layout (integers little-endian), as the model file's (format.py):
  0   8  magic b"EDGESESS"
  8   4  format version (u32): 2 (1 still loads)
  12  4  flags (u32, 0)
  16  8  header length in bytes (u64)
  24  32 sha256 of the header bytes
  56  8  reserved (0)
  64  .. header: UTF-8 JSON: the model's identity (its header's sha256 and file size), the
         cache's kv_type, context, per-layer slots/windows/write counts, next position,
         token ids, optional chat, and the three regions below with their crc32s
  ..     regions, each at a 64-byte boundary: K and V (each layer's n = min(written, slots)
         written slots [n, n_kv, width] of the stored type, layer after layer), then the
         slot positions (int64 [n] per layer). So a file holds the positions in use, not
         the whole context. (Version 1 stored every layer's [slots, ...] in full, the
         unwritten part a hole, and [slots] positions per layer.)

Saving writes a temporary file beside the target and renames it over the target. Loading
checks the header (identity, cache type and context, sizes against the file length and
against the model's shapes) before it reads, reads the regions into new arrays of the
cache's shapes (anonymous memory: only what is read costs pages) and checks their
checksums, all before it changes anything; the arrays then take the place of the cache's
own. The loaded session owns its memory: the file may be truncated, overwritten or deleted
afterwards without effect. Any problem is a SessionError (one line) and the model stays as
it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import arguments
from ..errors import ArgumentError, SessionError
from ..runtime import output_file
from .kv_cache import CacheState, lazy_zeros
from .kv_types import KV_DTYPE

MAGIC = b"EDGESESS"
VERSION = 2
VERSIONS = (1, 2)  # what loads
ALIGN = 64
PREAMBLE = struct.Struct("<8sIIQ32s8s")  # 64 bytes
MAX_HEADER_BYTES = 1 << 28


@dataclass
class Session:
    """A session file, read and checked: what `apply` puts into the model."""

    path: Path
    tokens: list[int]
    state: CacheState  # positions and counts (k/v: the live slots of the arrays below)
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


def _layout(cache, live: list[int], version: int = VERSION) -> dict:
    """The regions a session of `cache` holding `live` [layers] written slots has: what a
    file must match, whatever it claims. Per layer, where its slots start in the K (and V)
    region and in the positions region, in slots."""
    layer = cache.layers[0]
    n_kv, width = layer.k.shape[1], layer.k.shape[2]
    item = KV_DTYPE[cache.kv_type].itemsize
    stored = live if version >= 2 else [int(c) for c in cache.caps]
    starts = np.concatenate([[0], np.cumsum(stored)[:-1]]).astype(int).tolist()
    slots = int(sum(stored))
    kv_bytes = slots * n_kv * width * item
    v_off = _align(kv_bytes)
    pos_off = v_off + _align(kv_bytes)
    return {"n_kv": n_kv, "width": width, "item": item, "kv_bytes": kv_bytes,
            "k_offset": 0, "v_offset": v_off, "pos_offset": pos_off, "starts": starts,
            "counts": stored,
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
    st = cache.state(copy=False)
    k_live = _live([layer.k for layer in cache.layers], st.written, cache.layers)
    v_live = _live([layer.v for layer in cache.layers], st.written, cache.layers)
    pos = np.concatenate(_live([layer.pos for layer in cache.layers], st.written,
                               cache.layers)).astype("<i8")
    lay = _layout(cache, [p.shape[0] for p in k_live])
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
    with output_file.replacing(path, SessionError) as tmp:
        with open(tmp, "wb") as f:
            f.write(PREAMBLE.pack(MAGIC, VERSION, 0, len(raw), hashlib.sha256(raw).digest(),
                                  b"\0" * 8))
            f.write(raw)
            for parts, off in ((k_live, lay["k_offset"]), (v_live, lay["v_offset"])):
                f.seek(data_start + off)
                for part in parts:  # layer after layer, the written slots only
                    f.write(_bytes(part))
            f.seek(data_start + lay["pos_offset"])
            f.write(pos.tobytes())
            f.truncate(data_start + lay["end"])
            f.flush()
            os.fsync(f.fileno())
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
            if version not in VERSIONS:
                raise SessionError(f"{where}: session format version {version} is not "
                                   f"supported (this edgellm reads {VERSIONS})")
            if hlen > min(MAX_HEADER_BYTES, st.st_size - PREAMBLE.size):
                raise SessionError(f"{where}: header length {hlen} runs past the end of the "
                                   f"file ({st.st_size} bytes): truncated or corrupt")
            raw = f.read(hlen)
            if hashlib.sha256(raw).digest() != digest:
                raise SessionError(f"{where}: header checksum mismatch: file is corrupt")
            header = _json(where, raw)
            return _check(llm, where, header, version, f, _align(PREAMBLE.size + hlen),
                          os.fstat(f.fileno()).st_size, path)
    except OSError as e:
        raise SessionError(f"{where}: cannot read: {e.strerror or e}") from None


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


def _check(llm, where: str, header: dict, version: int, f, data_start: int, size: int,
           path: Path) -> Session:
    """The session of a file whose header `header` checked out: the header's fields checked
    against the model, then the regions read from `f` and checked against their crc32s."""
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
    live = [min(wr, layer.cap) for wr, layer in zip(written, cache.layers)]
    lay = _layout(cache, live, version)
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
    if data_start + lay["end"] > size:
        raise SessionError(f"{where}: file is truncated ({size} bytes, the cache needs "
                           f"{data_start + lay['end']})")
    k, v, stored_pos, got = _read_regions(where, f, cache, lay, live, data_start, kv_type)
    if got["pos"] != crcs["pos"]:
        raise SessionError(f"{where}: checksum mismatch in the slot positions: file is corrupt")
    pos = [p[:n].astype(np.int64) for p, n in zip(stored_pos, live)]
    if any(p.size and (p.min() < -1 or p.max() >= max(next_pos, 1)) for p in pos):
        raise SessionError(f"{where}: slot positions out of range: file is corrupt")
    for name in ("k", "v"):
        if got[name] != crcs[name]:
            raise SessionError(f"{where}: checksum mismatch in the {name.upper()} cache: "
                               "file is corrupt")
    ks = [k[start:start + n] for start, n in zip(cache.starts.tolist(), live)]
    vs = [v[start:start + n] for start, n in zip(cache.starts.tolist(), live)]
    state = CacheState(ks, vs, pos, written, next_pos, n_tokens)
    messages = _messages(where, chat)
    return Session(path, list(tokens), state, k, v, chat, messages)


def _read_regions(where: str, f, cache, lay: dict, live: list[int], data_start: int,
                  kv_type: str):
    """K, V [slots, n_kv, width] (the cache's shapes, new anonymous memory: only the read
    slots cost pages) holding each layer's `live` slots read from the file, each layer's
    stored positions ([live]; version 1: [slots], unwritten ones -1), and the crc32 of
    what was read of each region {"k", "v", "pos"} (as the header's cover them)."""
    slots = int(sum(int(c) for c in cache.caps))
    shape = (slots, lay["n_kv"], lay["width"])
    dtype = KV_DTYPE[kv_type]
    k, v = lazy_zeros(shape, dtype), lazy_zeros(shape, dtype)
    per_slot = lay["n_kv"] * lay["width"] * lay["item"]
    crcs = {}
    for name, arr, off in (("k", k, lay["k_offset"]), ("v", v, lay["v_offset"])):
        crc = 0
        for start, stored, n in zip(cache.starts.tolist(), lay["starts"], live):
            crc = _read_into(where, f, data_start + off + stored * per_slot,
                             arr[start:start + n], crc)
        crcs[name] = crc
    pos, crc = [], 0
    for stored, n in zip(lay["starts"], lay["counts"]):
        p = np.empty(n, "<i8")
        crc = _read_into(where, f, data_start + lay["pos_offset"] + stored * 8, p, crc)
        pos.append(p)
    crcs["pos"] = crc
    return k, v, pos, crcs


READ_CHUNK = 1 << 20  # read and checksum a chunk while it is in the cache


def _read_into(where: str, f, offset: int, out: np.ndarray, crc: int) -> int:
    """Fill the contiguous array `out` with the file's bytes at `offset`; returns `crc`
    continued over them (SessionError if the file ends first: it may have shrunk since
    its size was checked)."""
    view = _bytes(out)
    f.seek(offset)
    done = 0
    while done < len(view):
        got = f.readinto(view[done:done + READ_CHUNK])
        if not got:
            raise SessionError(f"{where}: file is truncated (it ended at byte "
                               f"{offset + done} while being read)")
        crc = zlib.crc32(view[done:done + got], crc)
        done += got
    return crc


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
    """Put a checked session into the model: its arrays in place of the cache's, its ids
    and positions."""
    model = llm.model
    model.cache.adopt(session.k, session.v, session.state)
    model.tokens[:] = session.tokens


def load_session(llm, path: str | os.PathLike) -> Session:
    """Read, check and apply a session file (SessionError, model unchanged, if it is bad)."""
    session = read_session(llm, path)
    apply(llm, session)
    return session
