"""Read a CTranslate2 Whisper directory (faster-whisper's models): model.bin, config.json,
tokenizer.json, vocabulary.txt.

model.bin, little-endian, unaligned:
    u32 binary version (6) | string spec name ("WhisperSpec") | u32 spec revision (3)
    u32 variable count, then per variable:
        string name | u8 rank | u32 dims[rank] | u8 dtype | u32 byte count | bytes
    u32 alias count, then (alias, target) string pairs
    string = u16 length (counting its NUL) | bytes | NUL
    dtype: 0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16
Variables are renamed to transformers' WhisperForConditionalGeneration names (one to one):
CTranslate2 fuses self-attention's q, k, v into linear_0 (k's bias stored as zeros: a key
bias adds q.b to every score of a query, which softmax ignores) and cross-attention's k, v
into linear_1; they are split here. config.json gives the suppress lists, the language
ids and the alignment heads; vocabulary.txt the special tokens (the timestamps are only
there, not in tokenizer.json).
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from edgellm.errors import SourceError

from . import whisper_meta
from .source import Source, SourceTensor

_DTYPES = {0: ("f32", "<f4"), 1: ("i8", "i1"), 2: ("i16", "<i2"), 3: ("i32", "<i4"),
           4: ("f16", "<f2"), 5: ("bf16", "<u2")}
VERSIONS = (5, 6)
_GELU = 3  # CTranslate2's ActivationType::GELU (erf)
_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/(.+)")
# CTranslate2 sub-name -> transformers' (fused ones split below)
_NORMS = {"self_attention/layer_norm": "self_attn_layer_norm",
          "attention/layer_norm": "encoder_attn_layer_norm",
          "ffn/layer_norm": "final_layer_norm"}
_LINEARS = {"self_attention/linear_1": "self_attn.out_proj", "attention/linear_0":
            "encoder_attn.q_proj", "attention/linear_2": "encoder_attn.out_proj",
            "ffn/linear_0": "fc1", "ffn/linear_1": "fc2"}
_GLOBAL = {"encoder/conv1/weight": "model.encoder.conv1.weight",
           "encoder/conv1/bias": "model.encoder.conv1.bias",
           "encoder/conv2/weight": "model.encoder.conv2.weight",
           "encoder/conv2/bias": "model.encoder.conv2.bias",
           "encoder/position_encodings/encodings": "model.encoder.embed_positions.weight",
           "encoder/layer_norm/gamma": "model.encoder.layer_norm.weight",
           "encoder/layer_norm/beta": "model.encoder.layer_norm.bias",
           "decoder/embeddings/weight": "model.decoder.embed_tokens.weight",
           "decoder/position_encodings/encodings": "model.decoder.embed_positions.weight",
           "decoder/layer_norm/gamma": "model.decoder.layer_norm.weight",
           "decoder/layer_norm/beta": "model.decoder.layer_norm.bias"}


class _Reader:
    def __init__(self, buf, where: str):
        self.buf, self.pos, self.where = buf, 0, where

    def take(self, n: int) -> int:
        if self.pos + n > len(self.buf):
            raise SourceError(f"{self.where}: truncated at byte {self.pos} (need {n} more)")
        at, self.pos = self.pos, self.pos + n
        return at

    def u(self, fmt: str) -> int:
        return struct.unpack_from("<" + fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.u("H")
        at = self.take(n)
        raw = bytes(self.buf[at:at + n])
        if n == 0 or raw[-1] != 0:
            raise SourceError(f"{self.where}: bad string at byte {at}")
        return raw[:-1].decode("utf-8", "replace")


def read_variables(path: Path) -> tuple[dict[str, tuple[str, tuple, int, int]], dict]:
    """{name: (dtype, shape, offset, nbytes)} of model.bin, and its aliases."""
    where = str(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SourceError(f"{where}: cannot read: {e.strerror or e}") from None
    with f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise SourceError(f"{where}: empty file") from None
    r = _Reader(buf, where)
    version = r.u("I")
    if version not in VERSIONS:
        raise SourceError(f"{where}: CTranslate2 binary version {version} is not supported "
                          f"({', '.join(map(str, VERSIONS))})")
    spec = r.string()
    if spec != "WhisperSpec":
        raise SourceError(f"{where}: spec {spec!r} is not a Whisper model (WhisperSpec)")
    r.u("I")  # revision
    out = {}
    for _ in range(r.u("I")):
        name = r.string()
        shape = tuple(r.u("I") for _ in range(r.u("B")))
        code = r.u("B")
        if code not in _DTYPES:
            raise SourceError(f"{where}: variable {name} has unknown dtype {code}")
        nbytes = r.u("I")
        out[name] = (code, shape, r.take(nbytes), nbytes)
        if nbytes != int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[code][1]).itemsize:
            raise SourceError(f"{where}: variable {name}: {nbytes} bytes for shape {list(shape)}")
    aliases = {}
    for _ in range(r.u("I")):
        alias = r.string()
        aliases[alias] = r.string()
    return {"buf": buf, "vars": out}, aliases


def _array(model: dict, name: str) -> np.ndarray:
    code, shape, at, nbytes = model["vars"][name]
    raw = np.frombuffer(model["buf"], _DTYPES[code][1], nbytes // np.dtype(
        _DTYPES[code][1]).itemsize, at)
    if code == 5:
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.reshape(shape)


def _scalar(model: dict, name: str, default=None):
    return int(_array(model, name).reshape(-1)[0]) if name in model["vars"] else default


def open_ct2(path: str | Path) -> Source:
    """A Source over a CTranslate2 Whisper directory."""
    root = Path(path)
    model, _ = read_variables(root / "model.bin")
    v = model["vars"]
    where = str(root / "model.bin")
    for need in ("decoder/embeddings/weight", "encoder/conv1/weight",
                 "encoder/position_encodings/encodings"):
        if need not in v:
            raise SourceError(f"{where}: variable {need} is missing")
    act = _scalar(model, "decoder/activation", _GELU)
    if act != _GELU:
        raise SourceError(f"{where}: activation {act} is not GELU")
    vocab, d = v["decoder/embeddings/weight"][1]
    layers = {side: 1 + max((int(m.group(2)) for m in map(_LAYER.fullmatch, v) if m and
                             m.group(1) == side), default=-1) for side in ("encoder", "decoder")}
    ffn = v["encoder/layer_0/ffn/linear_0/weight"][1][0]
    config = whisper_meta.runtime_config({
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab, "d_model": d, "num_mel_bins": v["encoder/conv1/weight"][1][1],
        "encoder_layers": layers["encoder"], "decoder_layers": layers["decoder"],
        "encoder_attention_heads": _scalar(model, "encoder/num_heads"),
        "decoder_attention_heads": _scalar(model, "decoder/num_heads"),
        "encoder_ffn_dim": ffn, "decoder_ffn_dim": v["decoder/layer_0/ffn/linear_0/weight"][1][0],
        "max_source_positions": v["encoder/position_encodings/encodings"][1][0],
        "max_target_positions": v["decoder/position_encodings/encodings"][1][0],
        "activation_function": "gelu", "layer_norm_eps": 1e-5})
    cfg = _json(root / "config.json")
    words = _vocabulary(root / "vocabulary.txt", vocab)
    idx = {w: i for i, w in enumerate(words)}
    try:
        sot, eot, nt = (idx[t] for t in ("<|startoftranscript|>", "<|endoftext|>",
                                         "<|notimestamps|>"))
    except KeyError as e:
        raise SourceError(f"{root / 'vocabulary.txt'}: special token {e} is missing") from None
    langs = {words[i][2:-2]: i for i in cfg.get("lang_ids") or []}
    meta = whisper_meta.header(vocab, sot, eot, nt, langs, cfg.get("suppress_ids") or [],
                               cfg.get("suppress_ids_begin") or [],
                               cfg.get("alignment_heads") or [])
    tok_path = root / "tokenizer.json"
    tokenizer_json = tok_path.read_text("utf-8") if tok_path.is_file() else None
    gen = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
           "decoder_start_token_id": sot}
    return Source(str(root), config, lambda: _tensors(model, where), tokenizer_json, {}, None,
                  gen, kind="ct2", whisper=meta)


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text("utf-8"))
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise SourceError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path}: not a JSON object")
    return value


def _vocabulary(path: Path, vocab: int) -> list[str]:
    try:
        words = path.read_text("utf-8").split("\n")
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    if words and words[-1] == "":
        words.pop()
    if len(words) != vocab:
        raise SourceError(f"{path}: {len(words)} tokens, the model has {vocab}")
    return words


def _tensor(model: dict, name: str, ct2: str, rows: slice | None = None) -> SourceTensor:
    code, shape, _, _ = model["vars"][ct2]
    if rows is not None:
        shape = (rows.stop - rows.start, *shape[1:])

    def load() -> np.ndarray:
        a = _array(model, ct2)
        return np.asarray(a if rows is None else a[rows], dtype=np.float32)

    return SourceTensor(name, shape, _DTYPES[code][0], load)


def _tensors(model: dict, where: str) -> Iterator[SourceTensor]:
    for ct2, name in _GLOBAL.items():
        if ct2 not in model["vars"]:
            raise SourceError(f"{where}: variable {ct2} is missing")
        t = _tensor(model, name, ct2)
        yield whisper_meta.conv_as_matrix(t, name) if len(t.shape) == 3 else t
    for ct2 in model["vars"]:
        m = _LAYER.fullmatch(ct2)
        if not m or not ct2.endswith(("/weight", "/bias", "/gamma", "/beta")):
            continue
        side, i, rest = m.groups()
        prefix = f"model.{side}.layers.{i}."
        sub, leaf = rest.rsplit("/", 1)
        suffix = {"gamma": "weight", "beta": "bias"}.get(leaf, leaf)
        if sub in _NORMS:
            yield _tensor(model, prefix + f"{_NORMS[sub]}.{suffix}", ct2)
        elif sub in _LINEARS:
            yield _tensor(model, prefix + f"{_LINEARS[sub]}.{suffix}", ct2)
        elif sub in ("self_attention/linear_0", "attention/linear_1"):
            attn = "self_attn" if sub.startswith("self") else "encoder_attn"
            parts = ("q", "k", "v") if attn == "self_attn" else ("k", "v")
            d = model["vars"][ct2][1][0] // len(parts)
            for j, p in enumerate(parts):
                if p == "k" and suffix == "bias":
                    continue  # zeros (see the module docstring); transformers has none
                yield _tensor(model, prefix + f"{attn}.{p}_proj.{suffix}", ct2,
                              slice(j * d, (j + 1) * d))
        else:
            raise SourceError(f"{where}: variable {ct2} is not part of a Whisper model")


def is_ct2_dir(path: Path) -> bool:
    """Whether `path` is a CTranslate2 model directory (model.bin beside config.json)."""
    return (path / "model.bin").is_file() and not any(path.glob("*.safetensors"))
