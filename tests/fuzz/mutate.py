"""Seeded mutations of edgellm's three inputs: packed files, safetensors directories, GGUF files.

A mutator takes a `random.Random` and a base and returns (description, mutated input). The
same seed gives the same corpus, so a failure found by `run_fuzz.py` is reproduced by its
seed and case number. Mutations cover truncation at every region, bit flips, and header
fields that lie: sizes, offsets, shapes, counts, dtypes, negative or huge numbers,
misalignment, overlapping tensors, duplicate names, JSON that is not an object, and configs
that contradict the tensor shapes (re-signed, so they get past the checksums and reach the
deeper checks).
"""

from __future__ import annotations

import copy
import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgellm.modelfile import format as fmt

TESTS = Path(__file__).resolve().parent.parent
TINY = TESTS / "fixtures" / "tiny"

# Numbers that break things: boundaries, signs, widths of C integer types.
INTS = [0, 1, -1, 2, 3, 7, 16, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 511, 512, 513, 1024,
        4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**53 + 1,
        2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, -2**31, -2**63, 10**30]
ODD = [None, True, False, "", "x", "64", 1.5, 64.0, float("nan"), float("inf"), -0.0, [], [64],
       {}, {"a": 1}, "\n", "a\x00b"]
HOSTILE_TEMPLATES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{% for i in range(10**9) %}x{% endfor %}",
    "{{ 'x' * 10**9 }}",
    "{% for m in messages %}{{ m.content * 100000 }}{{ m.content * 100000 }}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ raise_exception('no') }}",
    "{% if %}",
    "{{ messages[0].content | attr('__class__') }}",
    "{{ self._TemplateReference__context }}",
    "{{ lipsum.__globals__ }}",
    "{{ (2 ** 100000) }}",
    "{{ '%999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{% include '/etc/passwd' %}",
    "{% import 'os' as os %}",
    "{{ messages|tojson(indent=10**8) }}",
    "{{ ('x' * 999999).translate({120: 'y' * 999999}) }}",
]
CONFIG_KEYS = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "num_hidden_layers", "max_position_embeddings",
               "rms_norm_eps", "rope_theta", "sliding_window", "tie_word_embeddings",
               "model_type", "rope_parameters", "rope_scaling", "layer_types", "hidden_act",
               "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
               "partial_rotary_factor", "query_pre_attn_scalar", "mlp_only_layers",
               "decoder_sparse_step", "hidden_activation", "final_logit_softcapping"]


def interesting(rng: random.Random, near: object = None) -> object:
    """A value likely to break a parser: a boundary integer, an odd type, or near `near`."""
    r = rng.random()
    if isinstance(near, int) and not isinstance(near, bool) and r < 0.4:
        return rng.choice([near + 1, near - 1, near * 2, near // 2, -near, near * 1000,
                           near + 32, near + 64, 0])
    if r < 0.75:
        return rng.choice(INTS)
    return copy.deepcopy(rng.choice(ODD))


def flip_bits(raw: bytes, rng: random.Random, lo: int, hi: int, n: int) -> bytes:
    buf = bytearray(raw)
    hi = min(hi, len(buf))
    if hi <= lo:
        return bytes(buf)
    for _ in range(n):
        i = rng.randrange(lo, hi)
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def pick(rng: random.Random, table: list[tuple[float, Callable]]) -> Callable:
    total = sum(w for w, _ in table)
    x = rng.random() * total
    for w, f in table:
        x -= w
        if x <= 0:
            return f
    return table[-1][1]


# ===================================================================== packed files

@dataclass
class Packed:
    """A packed file split into its parts: header object, its length, and the data section."""

    raw: bytes
    header: dict
    hlen: int
    data: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Packed:
        hlen = struct.unpack_from("<Q", raw, 16)[0]
        header = json.loads(raw[64:64 + hlen])
        return cls(raw, header, hlen, raw[fmt.align(64 + hlen):])

    def join(self, header: dict | bytes) -> bytes:
        """A file with `header` (re-signed) and this data section."""
        hb = header if isinstance(header, bytes) else json.dumps(
            header, separators=(",", ":")).encode()
        pad = fmt.align(64 + len(hb)) - 64 - len(hb)
        return fmt.encode_preamble(hb) + hb + b"\0" * pad + self.data


def _tensor(rng: random.Random, h: dict) -> tuple[str, dict]:
    name = rng.choice(sorted(h["tensors"]))
    return name, h["tensors"][name]


def p_truncate(rng, b: Packed):
    regions = {"preamble": (0, 64), "header": (64, 64 + b.hlen),
               "padding": (64 + b.hlen, fmt.align(64 + b.hlen) + 1),
               "data": (fmt.align(64 + b.hlen), len(b.raw)), "tail": (len(b.raw) - 64, len(b.raw))}
    region = rng.choice(sorted(regions))
    lo, hi = regions[region]
    cut = rng.randrange(lo, max(lo + 1, hi))
    return f"truncate in {region} at {cut}", b.raw[:cut]


def p_bitflip(rng, b: Packed):
    start = fmt.align(64 + b.hlen)
    region, (lo, hi) = rng.choice([("data", (start, len(b.raw))), ("data", (start, len(b.raw))),
                                   ("header", (64, 64 + b.hlen)), ("preamble", (0, 64))])
    n = rng.choice([1, 1, 2, 8, 64])
    return f"{n} bit flips in {region}", flip_bits(b.raw, rng, lo, hi, n)


def p_header_text(rng, b: Packed):
    """Bytes of the JSON text changed, then re-signed: lying numbers, broken syntax."""
    text = bytearray(b.raw[64:64 + b.hlen])
    how = rng.choice(["digit", "digit", "bits", "delete", "insert"])
    for _ in range(rng.choice([1, 1, 3])):
        i = rng.randrange(len(text))
        if how == "digit":
            digits = [j for j, c in enumerate(text) if 48 <= c <= 57]
            i = rng.choice(digits)
            text[i] = rng.choice(b"0123456789-")
        elif how == "bits":
            text[i] ^= 1 << rng.randrange(8)
        elif how == "delete":
            del text[i:i + rng.choice([1, 2, 10])]
        else:
            text[i:i] = rng.choice([b"9", b"-", b"{", b"]", b",", b'"', b"\\", b"\xff", b"1e999"])
    return f"header text {how} (re-signed)", b.join(bytes(text))


def p_tensor_field(rng, b: Packed):
    h = copy.deepcopy(b.header)
    name, e = _tensor(rng, h)
    field = rng.choice(["type", "shape", "offset", "nbytes", "block_size", "crc32", "shape",
                        "offset"])
    if field == "type":
        value = rng.choice(["f32", "f16", "q8_0", "q4_0", "q4_1", "bf16", "q9_9", "", 3, None])
    elif field == "shape":
        s = list(e["shape"])
        value = rng.choice([
            s[::-1], s + [1], s[:1], [], [0] + s[1:], [interesting(rng, s[0])] + s[1:],
            s[:-1] + [interesting(rng, s[-1])], [2**31, 2**31], [1] * 5, "64", None])
    elif field == "offset":
        others = [t.get("offset") for t in h["tensors"].values()]
        off = e.get("offset") if isinstance(e.get("offset"), int) else 0
        value = rng.choice([rng.choice(others), off + rng.choice([1, 8, 32, 64]),
                            interesting(rng, off)])
    else:
        value = interesting(rng, e.get(field) if field != "crc32" else 0)
    if rng.random() < 0.1:
        e.pop(field, None)
        return f"tensor {name}: field {field} removed", b.join(h)
    e[field] = value
    return f"tensor {name}: {field} = {value!r:.60}", b.join(h)


def p_tensor_consistent(rng, b: Packed):
    """A lie that passes the format's checks: shape or type changed, nbytes to match."""
    from edgellm.modelfile import quant

    h = copy.deepcopy(b.header)
    name, e = _tensor(rng, h)
    shape = list(e["shape"])
    how = rng.choice(["transpose", "half", "type", "vector"])
    if how == "transpose" and len(shape) == 2:
        shape = shape[::-1]
    elif how == "half":
        i = rng.randrange(len(shape))
        shape[i] = max(1, shape[i] // 2)
    elif how == "vector":
        shape = [int(np.prod(shape)) // 2 or 1]
    if how == "type":
        e["type"] = rng.choice(["f32", "f16", "q8_0", "q4_0", "q4_1"])
    e["shape"] = shape
    try:
        e["nbytes"] = quant.qtype(e["type"]).nbytes(tuple(shape), e.get("block_size", 32))
    except Exception:
        pass
    return f"tensor {name}: {how} to {e['type']} {shape} (consistent nbytes)", b.join(h)


def p_config(rng, b: Packed):
    h = copy.deepcopy(b.header)
    c = h.setdefault("config", {})
    key = rng.choice(CONFIG_KEYS)
    value = interesting(rng, c.get(key))
    if key == "model_type" and rng.random() < 0.6:
        value = rng.choice(["gpt2", "llama", "qwen3_moe", "phi3", "gemma3_text", "mixtral",
                            "mistral", "", "LLAMA"])
    if key in ("rope_parameters", "rope_scaling") and rng.random() < 0.7:
        value = rng.choice([
            {"rope_type": "llama3", "rope_theta": 10000.0},
            {"rope_type": "linear", "rope_theta": 10000.0, "factor": "x"},
            {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0},
            {"rope_type": "longrope", "rope_theta": 1e4}, {"rope_type": 5},
            {"rope_theta": -1.0}, {"rope_theta": float("nan")}, [1, 2], "default",
            {"sliding_attention": {"rope_theta": "x"}, "full_attention": 3}])
    if key == "layer_types" and rng.random() < 0.7:
        n = c.get("num_hidden_layers", 3)
        value = rng.choice([["sliding_attention"] * (n + 1), [1] * n, "full_attention",
                            ["chunked_attention"] * n])
    if rng.random() < 0.1:
        c.pop(key, None)
        return f"config {key} removed", b.join(h)
    c[key] = value
    if key == "model_type" and isinstance(value, str) and rng.random() < 0.5:
        h["architecture"] = value
    return f"config {key} = {value!r:.60}", b.join(h)


def p_structure(rng, b: Packed):
    h = copy.deepcopy(b.header)
    how = rng.choice(["header list", "header str", "tensors list", "tensors null",
                      "entry list", "drop tensor", "add tensor", "rename layer", "rename ctrl",
                      "duplicate name", "deep nesting", "bad utf8", "hlen lie", "version",
                      "magic", "config list", "generation list", "empty tensors"])
    if how == "header list":
        return how, b.join(b"[1,2,3]")
    if how == "header str":
        return how, b.join(b'"tensors"')
    if how == "tensors list":
        h["tensors"] = list(h["tensors"].values())
    elif how == "tensors null":
        h["tensors"] = None
    elif how == "empty tensors":
        h["tensors"] = {}
    elif how == "entry list":
        name, e = _tensor(rng, h)
        h["tensors"][name] = list(e.values())
    elif how == "drop tensor":
        name, _ = _tensor(rng, h)
        del h["tensors"][name]
    elif how == "add tensor":
        name, e = _tensor(rng, h)
        new = rng.choice(["model.layers.99.mlp.up_proj.weight", "extra.weight",
                          name.replace("weight", "bias"), "lm_head.weight"])
        h["tensors"][new] = dict(e)
        how += f" {new}"
    elif how in ("rename layer", "rename ctrl"):
        name, e = _tensor(rng, h)
        del h["tensors"][name]
        new = name.replace("layers.0", "layers.7") if how == "rename layer" else name + "\n\x1b"
        h["tensors"][new] = e
    elif how == "duplicate name":
        name, e = _tensor(rng, h)
        text = json.dumps(h, separators=(",", ":"))
        entry = json.dumps({name: {**e, "offset": e["offset"]}}, separators=(",", ":"))[1:-1]
        text = text.replace('"tensors":{', '"tensors":{' + entry + ",", 1)
        return how, b.join(text.encode())
    elif how == "deep nesting":
        h["config"]["x"] = "PLACEHOLDER"
        text = json.dumps(h, separators=(",", ":")).replace('"PLACEHOLDER"',
                                                            "[" * 100000 + "]" * 100000)
        return how, b.join(text.encode())
    elif how == "bad utf8":
        return how, b.join(json.dumps(h).encode().replace(b'"config"', b'"conf\xffig"', 1))
    elif how == "hlen lie":
        raw = bytearray(b.raw)
        lie = interesting(rng, b.hlen)
        lie = lie if isinstance(lie, int) else b.hlen + 1
        raw[16:24] = struct.pack("<Q", lie % 2**64)
        return how, bytes(raw)
    elif how == "version":
        raw = bytearray(b.raw)
        raw[8:12] = struct.pack("<I", rng.choice([0, 2, 2**32 - 1]))
        return how, bytes(raw)
    elif how == "magic":
        return how, b"GGUF\0\0\0\0" + b.raw[8:]
    elif how == "config list":
        h["config"] = [h["config"]]
    elif how == "generation list":
        h["generation_config"] = [1]
    return how, b.join(h)


def tokenizer_text(b: Packed) -> str:
    """The file's tokenizer.json text: the header's, or rebuilt from the stored tokenizer."""
    tok = b.header.get("tokenizer") or {}
    st = tok.get("stored")
    if isinstance(tok.get("json"), str) or not isinstance(st, dict):
        return tok.get("json") or ""
    from edgellm.modelfile.tokenizer_store import build, decompress

    raw = decompress(b.data[st["offset"]:st["offset"] + st["nbytes"]], st["size"])
    return raw.decode() if st["kind"] == "json" else build(st["kind"], raw).to_str()


def p_meta(rng, b: Packed):
    h = copy.deepcopy(b.header)
    how = rng.choice(["tokenizer json", "tokenizer config", "template", "template",
                      "generation", "architecture", "tokenizer", "tokenizer stored"])
    if not isinstance(h.get("tokenizer"), dict):
        h["tokenizer"] = {}
    if not isinstance(h.get("generation_config"), dict):
        h["generation_config"] = {}
    if how == "tokenizer json":
        tok = h["tokenizer"]
        if not isinstance(tok.get("json"), str):
            tok["json"] = tokenizer_text(b)
        tok.pop("stored", None)  # a stored tokenizer would win over the header's text
        value = rng.choice([None, 5, "", "{", "[]", '{"model": {"type": "BPE"}}',
                            (tok.get("json") or "")[: rng.randrange(1, 2000)],
                            (tok.get("json") or "").replace('"vocab"', '"vocab_"'),
                            panicking_tokenizer(tok["json"], rng)])
        tok["json"] = value
    elif how == "tokenizer config":
        tok = h["tokenizer"]
        tok["config"] = rng.choice([[], "x", {"add_bos_token": True, "bos_token": None},
                                    {"bos_token": {"content": 5}, "eos_token": [1]},
                                    {"add_eos_token": True, "eos_token": "<nope>"}])
        value = tok["config"]
    elif how == "tokenizer":
        h["tokenizer"] = value = rng.choice([[], "x", 3, {"json": []}])
    elif how == "tokenizer stored":
        st = h["tokenizer"].setdefault("stored", {"kind": "bpe"})
        if not isinstance(st, dict):
            st = h["tokenizer"]["stored"] = {"kind": "bpe"}
        key = rng.choice(["kind", "offset", "nbytes", "size", "crc32", "tokens", "merges"])
        st[key] = value = rng.choice(["json", "zip", None, 3]) if key == "kind" \
            else interesting(rng, st.get(key))
    elif how == "template":
        h["chat_template"] = value = rng.choice(HOSTILE_TEMPLATES + [5, [], ""])
    elif how == "generation":
        g = h["generation_config"]
        key = rng.choice(["eos_token_id", "bos_token_id", "pad_token_id", "temperature",
                          "top_k", "top_p", "do_sample", "max_new_tokens", "repetition_penalty"])
        g[key] = value = interesting(rng, g.get(key))
        if rng.random() < 0.5:
            g["do_sample"] = True
        how += f" {key}"
    else:
        h["architecture"] = value = rng.choice(["gpt2", "", 5, "phi3", "qwen3_moe", None])
    return f"{how} = {value!r:.60}", b.join(h)


# Parts of a tokenizer.json on which the `tokenizers` library panics (a Rust panic, not an
# error): an unparsable precompiled charsmap, a regex that backtracks past onig's limit.
PANICKING_TOKENIZER_PARTS = [
    ("normalizer", {"type": "Precompiled", "precompiled_charsmap": "AAAA"}),
    ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": "(a|a?)+$"},
                       "behavior": "Isolated", "invert": False}),
]


def panicking_tokenizer(text: str, rng: random.Random) -> str:
    try:
        tok = json.loads(text)
    except (TypeError, ValueError):
        return "{"
    key, part = rng.choice(PANICKING_TOKENIZER_PARTS)
    tok[key] = part
    return json.dumps(tok)


def p_data_offsets(rng, b: Packed):
    """Offsets moved inside the data section: swapped between tensors, or overlapping."""
    h = copy.deepcopy(b.header)
    (n1, e1), (n2, e2) = _tensor(rng, h), _tensor(rng, h)
    if rng.random() < 0.5:
        e1["offset"], e2["offset"] = e2["offset"], e1["offset"]
        return f"offsets of {n1} and {n2} swapped", b.join(h)
    e1["offset"] = e2["offset"] + rng.choice([0, 64, 128])
    return f"{n1} moved onto {n2}", b.join(h)


def p_stack(rng, b: Packed):
    descs = []
    for _ in range(rng.choice([2, 3])):
        desc, raw = pick(rng, PACKED_RESIGNED)(rng, b)
        descs.append(desc)
        try:
            b = Packed.parse(raw)
        except Exception:
            return " + ".join(descs), raw
    return " + ".join(descs), b.raw


PACKED_RESIGNED = [(3, p_tensor_field), (3, p_tensor_consistent), (3, p_config),
                   (1, p_data_offsets), (1, p_meta)]
PACKED = [(2, p_truncate), (3, p_bitflip), (2, p_header_text), (3, p_tensor_field),
          (3, p_tensor_consistent), (4, p_config), (2, p_structure), (2, p_meta),
          (1, p_data_offsets), (2, p_stack)]


def mutate_packed(rng: random.Random, base: bytes) -> tuple[str, bytes]:
    return pick(rng, PACKED)(rng, Packed.parse(base))


# ============================================================ safetensors directories

@dataclass
class Safetensors:
    """One safetensors file: header object (without __metadata__ reordering) and data."""

    header: dict
    data: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Safetensors:
        n = struct.unpack_from("<Q", raw, 0)[0]
        return cls(json.loads(raw[8:8 + n]), raw[8 + n:])

    def join(self, header: dict | bytes | None = None, data: bytes | None = None) -> bytes:
        h = self.header if header is None else header
        hb = h if isinstance(h, bytes) else json.dumps(h, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        return struct.pack("<Q", len(hb)) + hb + (self.data if data is None else data)


def _shard(rng, files: dict[str, bytes]) -> str:
    return rng.choice(sorted(n for n in files if n.endswith(".safetensors")))


def s_truncate(rng, files):
    name = _shard(rng, files)
    raw = files[name]
    n = struct.unpack_from("<Q", raw, 0)[0]
    region, (lo, hi) = rng.choice([("length", (0, 8)), ("header", (8, 8 + n)),
                                   ("data", (8 + n, len(raw)))])
    files[name] = raw[:rng.randrange(lo, max(lo + 1, hi))]
    return f"{name} truncated in {region}"


def s_bitflip(rng, files):
    name = _shard(rng, files)
    raw = files[name]
    n = struct.unpack_from("<Q", raw, 0)[0]
    region, (lo, hi) = rng.choice([("length", (0, 8)), ("header", (8, 8 + n)),
                                   ("data", (8 + n, len(raw)))])
    k = rng.choice([1, 2, 16])
    files[name] = flip_bits(raw, rng, lo, hi, k)
    return f"{name}: {k} bit flips in {region}"


def s_header_field(rng, files):
    name = _shard(rng, files)
    st = Safetensors.parse(files[name])
    h = copy.deepcopy(st.header)
    tname = rng.choice(sorted(k for k in h if k != "__metadata__"))
    e = h[tname]
    field = rng.choice(["dtype", "shape", "data_offsets", "shape", "dtype"])
    if field == "dtype":
        e["dtype"] = value = rng.choice(["F64", "I64", "I32", "BOOL", "U8", "F8_E4M3", "XX",
                                         "F16", "BF16", "F32", 5])
    elif field == "shape":
        s = list(e["shape"])
        e["shape"] = value = rng.choice([s[::-1], s + [1], s[:1], [], [0] + s[1:],
                                         [interesting(rng, s[0])] + s[1:], [-1] * len(s),
                                         [2**40, 2**40], "x"])
    else:
        a, z = e["data_offsets"]
        e["data_offsets"] = value = rng.choice([[z, a], [a + 1, z + 1], [0, z - a],
                                                [a, z + 4], [-1, z], [a, 2**64], [a], "x",
                                                [interesting(rng, a), z]])
    files[name] = st.join(h)
    return f"{name}: {tname} {field} = {value!r:.60}"


def s_header_consistent(rng, files):
    """Shape or dtype changed so that the byte count still matches (passes safetensors)."""
    name = _shard(rng, files)
    st = Safetensors.parse(files[name])
    h = copy.deepcopy(st.header)
    tname = rng.choice(sorted(k for k in h if k != "__metadata__"))
    e = h[tname]
    s = list(e["shape"])
    how = rng.choice(["transpose", "flatten", "split", "f16 double"])
    if how == "transpose" and len(s) == 2:
        e["shape"] = s[::-1]
    elif how == "flatten":
        e["shape"] = [int(np.prod(s))]
    elif how == "split" and s[0] % 2 == 0:
        e["shape"] = [2, s[0] // 2] + s[1:]
    elif how == "f16 double" and e["dtype"] == "F32":
        e["dtype"], e["shape"] = "F16", s[:-1] + [s[-1] * 2]
    files[name] = st.join(h)
    return f"{name}: {tname} {how} -> {e['dtype']} {e['shape']}"


def s_header_structure(rng, files):
    name = _shard(rng, files)
    st = Safetensors.parse(files[name])
    h = copy.deepcopy(st.header)
    how = rng.choice(["not object", "duplicate", "length lie", "metadata", "extra tensor",
                      "drop tensor", "rename", "bad utf8", "nan data"])
    tname = rng.choice(sorted(k for k in h if k != "__metadata__"))
    if how == "not object":
        files[name] = st.join(rng.choice([b"[]", b'"x"', b"5", b"null"]))
    elif how == "duplicate":
        text = json.dumps(h, separators=(",", ":"))
        entry = json.dumps({tname: h[tname]}, separators=(",", ":"))[1:-1]
        files[name] = st.join(("{" + entry + "," + text[1:]).encode())
    elif how == "length lie":
        raw = bytearray(files[name])
        lie = interesting(rng, len(raw))
        raw[0:8] = struct.pack("<Q", (lie if isinstance(lie, int) else len(raw)) % 2**64)
        files[name] = bytes(raw)
    elif how == "metadata":
        h["__metadata__"] = rng.choice([{"format": 5}, [1], "x", {"a": {"b": 1}}])
        files[name] = st.join(h)
    elif how == "extra tensor":
        new = rng.choice(["model.layers.0.self_attn.o_proj.bias", "model.layers.9.x.weight",
                          "vision_tower.x", "lm_head.weight", "rotary_emb.inv_freq",
                          "model.layers.0.mlp.experts.gate_up_proj"])
        end = len(st.data)
        h[new] = {"dtype": "F32", "shape": [64], "data_offsets": [end, end + 256]}
        files[name] = st.join(h, st.data + b"\0" * 256)
    elif how == "drop tensor":
        del h[tname]  # its bytes stay: the offsets no longer cover the buffer
        files[name] = st.join(h)
    elif how == "rename":
        h[tname.replace("layers.0", "layers.7").replace("weight", "wieght")] = h.pop(tname)
        files[name] = st.join(h)
    elif how == "bad utf8":
        files[name] = st.join(json.dumps(h).encode().replace(b'"dtype"', b'"dt\xffype"', 1))
    else:
        e = h[tname]
        a, z = e["data_offsets"]
        data = bytearray(st.data)
        if e["dtype"] == "F32":
            data[a:a + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), 1e38]))
        files[name] = st.join(h, bytes(data))
    return f"{name}: {how} ({tname})"


def s_config(rng, files):
    c = json.loads(files["config.json"])
    how = rng.choice(["field", "field", "field", "not object", "invalid", "missing"])
    if how == "not object":
        files["config.json"] = rng.choice([b"[]", b"5", b'"llama"', b"null"])
        return "config.json not an object"
    if how == "invalid":
        files["config.json"] = rng.choice([b"{", b"", b"\xff\xfe", b'{"a":1}x', b"[" * 100000])
        return "config.json invalid"
    if how == "missing":
        del files["config.json"]
        return "config.json missing"
    key = rng.choice(CONFIG_KEYS)
    value = interesting(rng, c.get(key))
    if key == "model_type" and rng.random() < 0.6:
        value = rng.choice(["gpt2", "bert", "", "qwen3_moe", "phi3", "gemma3_text"])
    c[key] = value
    files["config.json"] = json.dumps(c).encode()
    return f"config {key} = {value!r:.60}"


def s_other_files(rng, files):
    how = rng.choice(["index", "tokenizer_config", "template", "generation", "remove shard",
                      "tokenizer", "remove tokenizer"])
    if how == "index" and "model.safetensors.index.json" not in files:
        how = "generation"
    if how == "index" and "model.safetensors.index.json" in files:
        idx = json.loads(files["model.safetensors.index.json"])
        wm = idx["weight_map"]
        k = rng.choice(sorted(wm))
        wm[k] = rng.choice(["../../etc/passwd", "missing.safetensors", ".hidden", 5,
                            "model-00001-of-00005.safetensors", "/abs.safetensors"])
        if rng.random() < 0.2:
            idx["weight_map"] = rng.choice([[], {}, "x"])
        files["model.safetensors.index.json"] = json.dumps(idx).encode()
        return f"index weight_map {k} lies"
    if how == "tokenizer_config":
        files["tokenizer_config.json"] = rng.choice([b"[]", b"{", b'{"chat_template": 5}',
                                                     b'{"chat_template": [{"name": 1}]}'])
    elif how == "template":
        files["chat_template.jinja"] = rng.choice([b"\xff\xfe", b"{% if %}"] + [
            t.encode() for t in HOSTILE_TEMPLATES])
    elif how == "generation":
        files["generation_config.json"] = rng.choice([
            b"[]", b'{"eos_token_id": -1}', b'{"temperature": "hot", "do_sample": true}',
            b'{"top_p": 0, "do_sample": true}', b'{"max_new_tokens": -3}',
            b'{"bos_token_id": 99999999999}'])
    elif how == "remove shard":
        del files[_shard(rng, files)]
    elif how == "tokenizer":
        files["tokenizer.json"] = rng.choice([b"{", b"\xff", b"[]", b'{"model": 5}'])
    else:
        files.pop("tokenizer.json", None)
    return how


SAFETENSORS = [(2, s_truncate), (2, s_bitflip), (3, s_header_field), (3, s_header_consistent),
               (3, s_header_structure), (3, s_config), (2, s_other_files)]


def mutate_safetensors(rng: random.Random, base: dict[str, bytes]) -> tuple[str, dict]:
    """A mutated copy of an HF directory given as {file name: bytes}."""
    files = dict(base)
    descs = [pick(rng, SAFETENSORS)(rng, files)]
    if rng.random() < 0.15:
        try:
            descs.append(pick(rng, SAFETENSORS)(rng, files))
        except Exception:  # the first mutation left nothing the second one can parse
            pass
    return " + ".join(descs), files


def read_dir(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())
            if p.is_file() and p.name != "reference.npz"}


def write_dir(files: dict[str, bytes], path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


# ========================================================================= GGUF files

GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
GGUF_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
               "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def _fixture_weights(folder: Path) -> dict[str, np.ndarray]:
    from converter.hf_source import open_hf

    return {t.name: t.load() for t in open_hf(folder).tensors()}


def gguf_meta(fixture: str) -> tuple[str, dict, dict[str, np.ndarray], dict]:
    """(arch, metadata {key: (kind, value)}, GGUF-named weights, tokenizer lists) of a fixture."""
    folder = TINY / fixture
    config = json.loads((folder / "config.json").read_text())
    arch = GGUF_ARCH[config["model_type"]]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    theta = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    meta = {
        f"{arch}.block_count": ("u32", config["num_hidden_layers"]),
        f"{arch}.context_length": ("u32", config["max_position_embeddings"]),
        f"{arch}.embedding_length": ("u32", config["hidden_size"]),
        f"{arch}.feed_forward_length": ("u32", config["intermediate_size"]),
        f"{arch}.attention.head_count": ("u32", heads),
        f"{arch}.attention.head_count_kv": ("u32", kv),
        f"{arch}.attention.key_length": ("u32", head_dim),
        f"{arch}.attention.value_length": ("u32", head_dim),
        f"{arch}.rope.dimension_count": ("u32", head_dim),
        f"{arch}.rope.freq_base": ("f32", theta),
        f"{arch}.attention.layer_norm_rms_epsilon": ("f32", config["rms_norm_eps"]),
        f"{arch}.vocab_size": ("u32", config["vocab_size"]),
        "tokenizer.ggml.bos_token_id": ("u32", config["bos_token_id"]),
        "tokenizer.ggml.eos_token_id": ("u32", config["eos_token_id"]),
    }
    weights = {}
    for hf, x in _fixture_weights(folder).items():
        if hf in GGUF_GLOBAL:
            weights[GGUF_GLOBAL[hf]] = x
        else:
            _, _, layer, rest = hf.split(".", 3)
            weights[f"blk.{layer}.{GGUF_BLOCK[rest]}"] = x
    tok = json.loads((folder / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    types = [1] * len(tokens)
    for added in tok["added_tokens"]:
        if added["id"] < len(types):
            types[added["id"]] = 3 if added["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    tokenizer = {"tokens": tokens, "types": types, "merges": merges,
                 "template": (folder / "chat_template.jinja").read_text()}
    return arch, meta, weights, tokenizer


def write_gguf(path: Path, arch: str, meta: dict, weights: dict[str, np.ndarray],
               tokenizer: dict | None, qtypes: Callable | None = None) -> Path:
    """A GGUF file (gguf.GGUFWriter) of GGUF-named `weights`; qtypes(name, x) -> type."""
    import gguf
    from gguf import GGMLQuantizationType as QT

    w = gguf.GGUFWriter(str(path), arch)
    add = {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string, "bool": w.add_bool,
           "i32": w.add_int32, "u64": w.add_uint64}
    for key, (kind, value) in meta.items():
        add[kind](key, value)
    if tokenizer is not None:
        w.add_tokenizer_model(tokenizer.get("model", "gpt2"))
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokenizer["tokens"])
        w.add_token_types(tokenizer["types"])
        w.add_token_merges(tokenizer["merges"])
        w.add_chat_template(tokenizer["template"])
    for name, x in weights.items():
        t = qtypes(name, x) if qtypes else QT.F32
        data = x.astype(np.float32) if t == QT.F32 else x.astype(np.float16) if t == QT.F16 \
            else gguf.quants.quantize(x.astype(np.float32), t)
        w.add_tensor(name, data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def mixed_types(name: str, x: np.ndarray):
    """The storage types of the base GGUFs: every type edgellm reads losslessly, and F16."""
    from gguf import GGMLQuantizationType as QT

    if x.ndim != 2:
        return QT.F32
    if name == "token_embd.weight":
        return QT.Q8_0
    return {"attn_q": QT.Q4_0, "attn_k": QT.Q4_1, "attn_v": QT.F16,
            "ffn_gate": QT.Q8_0}.get(name.split(".")[-2], QT.Q4_0)


@dataclass
class Slot:
    """An integer field of a GGUF file: where it is, its width, and what it is."""

    label: str
    offset: int
    size: int  # 4 or 8


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_slots(raw: bytes) -> tuple[list[Slot], int]:
    """Every count, length, type, dim and offset of a (valid) GGUF file; and the data start."""
    slots = [Slot("version", 4, 4), Slot("tensor count", 8, 8), Slot("kv count", 16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
    pos = 24

    def string(label: str) -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        slots.append(Slot(f"{label} length", pos, 8))
        s = raw[pos + 8:pos + 8 + n].decode("utf-8", "replace")
        pos += 8 + n
        return s

    def value(vtype: int, label: str) -> None:
        nonlocal pos
        if vtype in _SCALAR:
            if _SCALAR[vtype] in (4, 8):
                slots.append(Slot(f"value {label}", pos, _SCALAR[vtype]))
            pos += _SCALAR[vtype]
        elif vtype == 8:
            string(f"string {label}")
        elif vtype == 9:
            (etype,) = struct.unpack_from("<I", raw, pos)
            slots.append(Slot(f"array type {label}", pos, 4))
            (count,) = struct.unpack_from("<Q", raw, pos + 4)
            slots.append(Slot(f"array count {label}", pos + 4, 8))
            pos += 12
            for i in range(count):
                value(etype, f"{label}[{i}]") if etype != 9 else None
        else:
            raise ValueError(f"value type {vtype}")

    alignment = 32
    for _ in range(n_kv):
        key = string("key")
        (vtype,) = struct.unpack_from("<I", raw, pos)
        slots.append(Slot(f"type {key}", pos, 4))
        pos += 4
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", raw, pos)[0]
        value(vtype, key)
    for _ in range(n_tensors):
        name = string("tensor name")
        (n_dims,) = struct.unpack_from("<I", raw, pos)
        slots.append(Slot(f"n_dims {name}", pos, 4))
        pos += 4
        for d in range(n_dims):
            slots.append(Slot(f"dim{d} {name}", pos, 8))
            pos += 8
        slots.append(Slot(f"ggml type {name}", pos, 4))
        slots.append(Slot(f"data offset {name}", pos + 4, 8))
        pos += 12
    # Array elements are many and dull: keep few of them.
    slots = [s for s in slots if "[" not in s.label or s.label.endswith("[0]")]
    return slots, (pos + alignment - 1) // alignment * alignment


@dataclass
class GGUFBase:
    """A valid GGUF and what is needed to write variants of it."""

    raw: bytes
    arch: str
    meta: dict
    weights: dict[str, np.ndarray]
    tokenizer: dict
    slots: list[Slot]
    data_start: int

    @classmethod
    def make(cls, fixture: str, tmp: Path) -> GGUFBase:
        arch, meta, weights, tok = gguf_meta(fixture)
        path = write_gguf(tmp / f"{fixture}.gguf", arch, meta, weights, tok, mixed_types)
        raw = path.read_bytes()
        slots, start = gguf_slots(raw)
        return cls(raw, arch, meta, weights, tok, slots, start)


def g_truncate(rng, g: GGUFBase, tmp: Path):
    slot = rng.choice(g.slots)
    region, cut = rng.choice([
        ("header", rng.randrange(0, 24)), ("metadata", rng.randrange(24, max(25, slot.offset + 1))),
        ("at field", slot.offset + rng.randrange(slot.size)),
        ("data", rng.randrange(g.data_start, len(g.raw))),
        ("tail", len(g.raw) - rng.randrange(1, 64))])
    return f"truncated in {region} at {cut}", g.raw[:cut]


def g_bitflip(rng, g: GGUFBase, tmp: Path):
    lo, hi = rng.choice([(0, 24), (24, g.data_start), (g.data_start, len(g.raw))])
    n = rng.choice([1, 1, 4, 32])
    return f"{n} bit flips in [{lo}, {hi})", flip_bits(g.raw, rng, lo, hi, n)


def g_slot(rng, g: GGUFBase, tmp: Path):
    """One integer field set to a lie: counts, lengths, n_dims, dims, types, offsets."""
    slot = rng.choice(g.slots)
    old = int.from_bytes(g.raw[slot.offset:slot.offset + slot.size], "little")
    value = interesting(rng, old)
    if slot.label.startswith("ggml type"):
        value = rng.choice([0, 1, 2, 3, 6, 7, 8, 10, 12, 14, 30, 31, 39, 40, 250, 2**31])
    if not isinstance(value, int) or isinstance(value, bool):
        value = old ^ (1 << rng.randrange(slot.size * 8))
    raw = bytearray(g.raw)
    raw[slot.offset:slot.offset + slot.size] = (value % 2**(8 * slot.size)).to_bytes(
        slot.size, "little")
    return f"{slot.label} = {value} (was {old})", bytes(raw)


_ARCH_KEYS = ["block_count", "context_length", "embedding_length", "feed_forward_length",
              "attention.head_count", "attention.head_count_kv", "attention.key_length",
              "rope.dimension_count", "vocab_size", "rope.freq_base",
              "attention.layer_norm_rms_epsilon", "attention.sliding_window"]


def g_metadata(rng, g: GGUFBase, tmp: Path):
    """A rewritten file whose metadata contradicts the tensors (or is the wrong type)."""
    meta, weights, tok, arch = dict(g.meta), dict(g.weights), dict(g.tokenizer), g.arch
    how = rng.choice(["value", "value", "value", "type", "drop", "arch", "tensor", "tokens",
                      "tensor shape"])
    if how in ("value", "type", "drop"):
        key = f"{arch}.{rng.choice(_ARCH_KEYS)}"
        kind, old = meta.get(key, ("u32", 16))
        if how == "drop":
            meta.pop(key, None)
            desc = f"{key} dropped"
        elif how == "type":
            meta[key] = rng.choice([("str", "wide"), ("f32", 1.5), ("bool", True),
                                    ("i32", -4), ("u64", 2**40)])
            desc = f"{key} = {meta[key]!r}"
        else:
            new = interesting(rng, int(old))
            if not isinstance(new, int) or isinstance(new, bool):
                new = int(old) + 1
            if kind == "f32":
                meta[key] = ("f32", float(rng.choice([0.0, -1.0, float("nan"), float("inf"),
                                                      1e38, new])))
            else:
                meta[key] = ("u32", new % 2**32)
            desc = f"{key} = {meta[key][1]}"
    elif how == "arch":
        arch = rng.choice(["gpt2", "bert", "llama", "qwen2", "qwen3", "gemma3", "mistral"])
        meta = {k.replace(f"{g.arch}.", f"{arch}."): v for k, v in meta.items()}
        desc = f"architecture {arch}"
    elif how in ("tensor", "tensor shape"):
        name = rng.choice(sorted(weights))
        if how == "tensor":
            what = rng.choice(["drop", "extra", "rename"])
            if what == "drop":
                del weights[name]
            elif what == "extra":
                weights[rng.choice(["blk.0.mystery.weight", "blk.9.ffn_up.weight",
                                    "blk.0.attn_output.bias", "output.weight"])] = \
                    np.zeros((64,), np.float32)
            else:
                weights[name.replace("blk.0", "blk.5")] = weights.pop(name)
            desc = f"tensor {name}: {what}"
        else:
            x = weights[name]
            weights[name] = rng.choice([x.T.copy(), x[: max(1, x.shape[0] // 2)].copy(),
                                        np.zeros((x.size,), np.float32) if x.ndim == 2 else
                                        np.zeros((x.shape[0], 2), np.float32)])
            desc = f"tensor {name} reshaped to {list(weights[name].shape)}"
    else:
        what = rng.choice(["short", "types", "merges", "model", "bos", "template"])
        if what == "short":
            tok["tokens"] = tok["tokens"][: rng.randrange(1, len(tok["tokens"]))]
        elif what == "types":
            tok["types"] = tok["types"][:-1]
        elif what == "merges":
            tok["merges"] = ["a"] + tok["merges"][:5] + ["x y z"]
        elif what == "model":
            tok["model"] = rng.choice(["llama", "bert", "t5", "none", ""])
        elif what == "bos":
            meta["tokenizer.ggml.bos_token_id"] = ("u32", rng.choice([512, 99999, 2**32 - 1]))
        else:
            tok["template"] = rng.choice(HOSTILE_TEMPLATES)
        desc = f"tokenizer {what}"
    path = tmp / f"meta-{rng.randrange(2**32)}.gguf"
    try:
        write_gguf(path, arch, meta, weights, tok, mixed_types)
        raw = path.read_bytes()
    except Exception as e:  # the writer itself refused (e.g. a shape gguf cannot quantize)
        return f"{desc} (writer refused: {type(e).__name__})", g.raw
    finally:
        path.unlink(missing_ok=True)
    return desc, raw


GGUF = [(2, g_truncate), (2, g_bitflip), (5, g_slot), (4, g_metadata)]


def mutate_gguf(rng: random.Random, base: GGUFBase, tmp: Path) -> tuple[str, bytes]:
    desc, raw = pick(rng, GGUF)(rng, base, tmp)
    if rng.random() < 0.1:
        more = GGUFBase(raw, base.arch, base.meta, base.weights, base.tokenizer, base.slots,
                        base.data_start)
        d2, raw = pick(rng, [(1, g_bitflip), (1, g_slot)])(rng, more, tmp)
        desc += " + " + d2
    return desc, raw
