"""The tokenizer as the packed file stores it: compact, and built without a JSON round trip.

A tokenizer.json is ~60 bytes per token of JSON (Gemma 3's 262k tokens and 514k merges:
15.9 MB), and `tokenizers` parses it through an untagged enum that buffers the whole
document: building Gemma 3's from JSON peaks at +365 MiB. So the file (format version 2)
keeps it in the data section as one zlib-compressed blob, described by the header's
`tokenizer.stored` = {"kind", "offset", "nbytes", "size", "crc32", "tokens", "merges"}
(offset relative to the data section: the converter puts it first, the tensors after it;
size: the decompressed bytes). Two kinds:

  "bpe"   a BPE model whose ids are 0..n-1, as tables (all integers little-endian):
            u32 n_tokens, u32 n_merges, u32 rest_bytes, u32 0
            u32 offsets [n_tokens + 1]   token i is bytes[offsets[i]:offsets[i+1]] (UTF-8)
            i32 merges  [n_merges, 2]    token ids of each merge's parts, best rank first
            u8  bytes   [offsets[-1]]
            u8  rest    [rest_bytes]     the rest of tokenizer.json (normalizer, decoder,
                                         added tokens, ...; model vocab and merges empty)
          Gemma 3: 4.6 MB. Built with `tokenizers.models.BPE(vocab, merges)`: +206 MiB peak.
  "json"  anything else: the tokenizer.json text itself.

`store` writes the "bpe" kind only when the tokenizer built back from it serializes exactly
as the original does (ids, merges' ranks, added tokens and every option), else "json".
After building, freed memory goes back to the OS (glibc's malloc_trim): the build's
transient would otherwise stay in the process's resident set for the whole run.
"""

from __future__ import annotations

import ctypes
import functools
import json
import operator
import struct
import zlib

import numpy as np

from ..errors import TokenizerError

KINDS = ("bpe", "json")
_HEAD = struct.Struct("<IIII")
_BPE_OPTIONS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges")
LEVEL = 6  # zlib: level 9 writes far slower for little less


def _same(a, b) -> bool:
    """Two tokenizers.Tokenizer serialize alike (the text first: parsing both documents of
    a 262k vocabulary costs ~400 MiB; only map-ordered fields can make equal ones differ)."""
    x, y = a.to_str(), b.to_str()
    return x == y or json.loads(x) == json.loads(y)


def _bpe_tables(doc: dict) -> bytes | None:
    """The "bpe" blob of a parsed tokenizer.json, or None if its model is not a dense BPE."""
    model = doc.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        return None
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        return None  # ids with gaps: keep the JSON
    pairs = []
    for m in merges:
        parts = m.split(" ", 1) if isinstance(m, str) else m
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            return None
        pairs.append((vocab[parts[0]], vocab[parts[1]]))
    encoded = [t.encode("utf-8") for t in tokens]
    offsets = np.zeros(len(tokens) + 1, "<u4")
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    rest = dict(doc)
    rest["model"] = {**{k: v for k, v in model.items() if k not in ("vocab", "merges")},
                     "vocab": {}, "merges": []}
    rest_bytes = json.dumps(rest, ensure_ascii=False).encode("utf-8")
    return b"".join([_HEAD.pack(len(tokens), len(pairs), len(rest_bytes), 0),
                     offsets.tobytes(), np.asarray(pairs, "<i4").reshape(-1, 2).tobytes(),
                     b"".join(encoded), rest_bytes])


@functools.lru_cache(maxsize=2)  # the converter asks twice (size target, then the writer)
def store(tokenizer_json: str) -> tuple[dict, bytes]:
    """(header fields, compressed blob) for a tokenizer.json text; the header fields lack
    offset (the writer places the blob)."""
    import tokenizers

    original = tokenizers.Tokenizer.from_str(tokenizer_json)
    doc = json.loads(tokenizer_json)
    merges = len((doc.get("model") or {}).get("merges") or ())
    raw, kind = _bpe_tables(doc), "bpe"
    del doc
    if raw is not None:
        try:
            same = _same(_build_bpe(raw), original)
        except Exception:  # noqa: BLE001 - anything the rebuild refuses: keep the JSON
            same = False
        if not same:
            raw = None
    if raw is None:
        raw, kind = tokenizer_json.encode("utf-8"), "json"
    blob = zlib.compress(raw, LEVEL)
    return ({"kind": kind, "nbytes": len(blob), "size": len(raw),
             "crc32": f"{zlib.crc32(blob):08x}",
             "tokens": original.get_vocab_size(with_added_tokens=True), "merges": merges}, blob)


def decompress(blob, size: int) -> bytes:
    """The stored bytes; ValueError if they do not inflate to exactly `size` bytes."""
    d = zlib.decompressobj()
    try:
        raw = d.decompress(blob, size + 1)
    except zlib.error as e:
        raise ValueError(f"cannot decompress: {e}") from None
    if len(raw) != size or not d.eof:
        raise ValueError(f"decompresses to {len(raw)}{'+' * (not d.eof)} bytes, expected {size}")
    return raw


def _build_bpe(raw: bytes):
    """A tokenizers.Tokenizer from "bpe" tables (layout in the module docstring)."""
    import tokenizers

    n, m, rest_len, _ = _HEAD.unpack_from(raw)
    at = _HEAD.size
    offsets = np.frombuffer(raw, "<u4", n + 1, at)
    at += 4 * (n + 1)
    pairs = np.frombuffer(raw, "<i4", 2 * m, at).reshape(m, 2)
    at += 8 * m
    end = at + int(offsets[-1])
    if end + rest_len != len(raw) or np.any(offsets[1:] < offsets[:-1]) or (
            m and (pairs.min() < 0 or pairs.max() >= n)):
        raise ValueError("token tables are inconsistent")
    text = memoryview(raw)[at:end]
    bounds = offsets.tolist()
    tokens = [str(text[a:b], "utf-8") for a, b in zip(bounds, bounds[1:])]
    del bounds
    rest = json.loads(bytes(raw[end:]))
    model, added = rest["model"], rest.get("added_tokens") or []
    vocab = dict(zip(tokens, range(n)))
    if len(vocab) != n:
        raise ValueError("token table has duplicate tokens")
    get = operator.itemgetter
    left = get(*pairs[:, 0].tolist())(tokens) if m > 1 else tuple(tokens[i] for i in pairs[:, 0])
    right = get(*pairs[:, 1].tolist())(tokens) if m > 1 else tuple(tokens[i] for i in pairs[:, 1])
    merges = list(zip(left, right))
    del left, right, tokens
    options = {k: model[k] for k in _BPE_OPTIONS if model.get(k) is not None}
    bpe = tokenizers.models.BPE(vocab, merges, **options)
    del vocab, merges
    rest["added_tokens"] = []
    backend = tokenizers.Tokenizer.from_str(json.dumps(rest))
    backend.model = bpe
    tokens = [tokenizers.AddedToken(a["content"], single_word=a["single_word"],
                                    lstrip=a["lstrip"], rstrip=a["rstrip"],
                                    normalized=a["normalized"], special=a["special"])
              for a in added]
    backend.add_special_tokens([t for t, a in zip(tokens, added, strict=True) if a["special"]])
    backend.add_tokens([t for t, a in zip(tokens, added, strict=True) if not a["special"]])
    return backend


def build(kind: str, raw: bytes):
    """A tokenizers.Tokenizer from a stored tokenizer's decompressed bytes; TokenizerError
    if they are not a tokenizer."""
    import tokenizers

    try:
        if kind == "bpe":
            backend = _build_bpe(raw)
        else:
            backend = tokenizers.Tokenizer.from_buffer(raw)
    except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exceptions from Rust
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise TokenizerError(f"stored tokenizer ({kind}) is invalid: {first}") from None
    finally:
        release_freed_memory()
    return backend


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


def release_freed_memory() -> None:
    """Hand memory freed by a large build back to the OS (glibc keeps it otherwise)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
