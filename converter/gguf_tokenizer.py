"""Rebuild a Hugging Face tokenizer.json (+ tokenizer_config) from GGUF tokenizer.ggml.* metadata.

Two vocabulary kinds, as llama.cpp reads them (`llama-vocab.cpp`):
- "gpt2": byte-level BPE. Vocab from tokenizer.ggml.tokens, ranked merges from
  tokenizer.ggml.merges, and a pre-tokenizer chosen by tokenizer.ggml.pre: llama.cpp splits
  text with a list of regexes applied one after the other, which is a `tokenizers`
  Sequence of isolating Splits followed by a ByteLevel mapping without its own regex.
- "llama": SentencePiece-style BPE with scores (HF's LlamaTokenizerFast form): byte fallback,
  "▁" for spaces (prepended when add_space_prefix), merges derived from the scores as
  transformers' GGUF converter does.
Token types (tokenizer.ggml.token_type): CONTROL and UNKNOWN become special added tokens,
USER_DEFINED non-special added tokens (llama.cpp matches both before pre-tokenizing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer

from edgellm.errors import TokenizerError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's regex lists (llm_tokenizer_bpe), by pre-tokenizer family.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "gpt2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "smollm": (r"\p{N}", _GPT2),  # also StarCoder's: single digits, then GPT-2
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "bloom": (r" ?[^(\s|.,!?…。，、।۔،)]+",),
}
# tokenizer.ggml.pre value -> family above (llama.cpp's llama_vocab::impl::load).
PRE_TOKENIZERS: dict[str, str] = {
    "default": "default",
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"),
                    "llama3"),
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"), "gpt2"),
    **dict.fromkeys(("qwen2", "stablelm2", "megrez"), "qwen2"),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"), "smollm"),
    "falcon": "falcon",
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), "bloom"),
}


class _Fields:
    """Typed reads of tokenizer.* metadata; TokenizerError naming the file and field."""

    def __init__(self, meta: Mapping[str, Any], path: str):
        self.meta, self.path = meta, path

    def fail(self, key: str, what: str) -> TokenizerError:
        return TokenizerError(f"{self.path}: {key} {what}")

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        if key not in self.meta:
            return default
        value = self.meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, f"is {type(value).__name__}, expected {kind.__name__}")
        return value

    def array(self, key: str, kind: type, n: int | None = None) -> list | None:
        value = self.meta.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
            raise self.fail(key, f"is not an array of {kind.__name__}")
        if n is not None and len(value) != n:
            raise self.fail(key, f"has {len(value)} entries for {n} tokens")
        return value

    def token_id(self, key: str, n: int, default: int | None = None) -> int | None:
        value = self.get(key, int, default)
        if value is not None and not 0 <= value < n:
            raise self.fail(key, f"is {value}, outside the vocabulary of {n} tokens")
        return value


def build_tokenizer(meta: Mapping[str, Any], path: str) -> tuple[str | None, dict]:
    """(tokenizer.json text, tokenizer_config dict) for GGUF metadata `meta` of file `path`.

    A file without a vocabulary (no tokenizer.ggml.model, or "none"/"no_vocab") gives
    (None, {}): the caller decides whether that is an error.
    """
    f = _Fields(meta, path)
    kind = f.get("tokenizer.ggml.model", str)
    if kind in (None, "none", "no_vocab"):
        return None, {}
    tokens = f.array("tokenizer.ggml.tokens", str)
    if not tokens:
        raise f.fail("tokenizer.ggml.tokens", "is missing or empty")
    # llama.cpp names empty tokens so that every id stays reachable.
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    types = f.array("tokenizer.ggml.token_type", int, n) or [NORMAL] * n
    if kind == "gpt2":
        pre = f.get("tokenizer.ggml.pre", str, "default")
        if pre not in PRE_TOKENIZERS:
            raise f.fail("tokenizer.ggml.pre", f"{pre!r} is not a supported pre-tokenizer "
                         f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
        family = PRE_TOKENIZERS[pre]
        defaults = {"bos": None, "eos": None, "unk": None, "add_bos": family == "llama3"}
    elif kind == "llama":
        defaults = {"bos": 1, "eos": 2, "unk": 0, "add_bos": True}
    else:
        raise f.fail("tokenizer.ggml.model", f"{kind!r} is not supported (gpt2 or llama)")
    ids = {
        "bos": f.token_id("tokenizer.ggml.bos_token_id", n, defaults["bos"]),
        "eos": f.token_id("tokenizer.ggml.eos_token_id", n, defaults["eos"]),
        "unk": f.token_id("tokenizer.ggml.unknown_token_id", n, defaults["unk"]),
        "pad": f.token_id("tokenizer.ggml.padding_token_id", n),
    }
    add_bos = f.get("tokenizer.ggml.add_bos_token", bool, defaults["add_bos"])
    add_eos = f.get("tokenizer.ggml.add_eos_token", bool, False)
    if add_bos and ids["bos"] is None:
        raise f.fail("tokenizer.ggml.bos_token_id", "is missing but add_bos_token is set")
    if add_eos and ids["eos"] is None:
        raise f.fail("tokenizer.ggml.eos_token_id", "is missing but add_eos_token is set")

    if kind == "gpt2":
        merges = _split_merges(f, f.array("tokenizer.ggml.merges", str))
        body = _byte_level(tokens, merges, PRE_TOKENIZER_REGEXES[family], family == "llama3")
    else:
        add_prefix = f.get("tokenizer.ggml.add_space_prefix", bool, True)
        merges = f.array("tokenizer.ggml.merges", str)
        if merges is not None:
            pairs = _split_merges(f, merges)
        else:
            scores = f.array("tokenizer.ggml.scores", float, n)
            if scores is None:
                raise f.fail("tokenizer.ggml.scores", "is missing (needed without merges)")
            pairs = merges_from_scores(tokens, scores, types)
        unk = tokens[ids["unk"]] if ids["unk"] is not None else None
        body = _sentencepiece_bpe(tokens, pairs, unk, add_prefix)

    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] != USER_DEFINED}
        for i, t in enumerate(tokens) if types[i] in (CONTROL, UNKNOWN, USER_DEFINED)
    ]
    bos = tokens[ids["bos"]] if add_bos else None
    eos = tokens[ids["eos"]] if add_eos else None
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           **body, "post_processor": _template(bos, ids["bos"], eos, ids["eos"])}
    doc = {k: doc[k] for k in ("version", "truncation", "padding", "added_tokens", "normalizer",
                               "pre_tokenizer", "post_processor", "decoder", "model")}
    text = json.dumps(doc, ensure_ascii=False)
    try:
        Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises plain Exception subclasses from Rust
        raise TokenizerError(f"{path}: rebuilt tokenizer is invalid: {_one_line(e)}") from e

    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for name in ("bos", "eos", "unk", "pad"):
        if ids[name] is not None:
            config[f"{name}_token"] = tokens[ids[name]]
    config["add_bos_token"] = add_bos
    config["add_eos_token"] = add_eos
    template = f.get("tokenizer.chat_template", str)
    if template is not None:
        config["chat_template"] = template
    return text, config


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _split_merges(f: _Fields, merges: list[str] | None) -> list[list[str]]:
    """"a b" merge strings -> [a, b] pairs, split at the first space after the first
    character, as llama.cpp does (a merge's left part may itself start with a space)."""
    if merges is None:
        raise f.fail("tokenizer.ggml.merges", "is missing")
    pairs = []
    for i, m in enumerate(merges):
        pos = m.find(" ", 1)
        if pos < 0:
            raise f.fail("tokenizer.ggml.merges", f"entry {i} ({m!r}) is not 'left right'")
        pairs.append([m[:pos], m[pos + 1:]])
    return pairs


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float],
                       types: Sequence[int]) -> list[list[str]]:
    """BPE merges for a SentencePiece vocabulary with scores (transformers' GGUF converter).

    Every split of a normal piece into two normal pieces is a merge; merges rank by the
    merged piece's score (best first), ties by the parts' scores. Only normal pieces take
    part, so control and byte tokens never come out of merging text.
    """
    score = {t: s for t, s, k in zip(tokens, scores, types, strict=True) if k == NORMAL}
    ranked = []
    for piece, s in score.items():
        local = [(score[piece[:k]], score[piece[k:]], piece[:k], piece[k:])
                 for k in range(1, len(piece)) if piece[:k] in score and piece[k:] in score]
        local.sort(key=lambda x: (x[0], x[1]), reverse=True)
        ranked.extend((s, left, right) for _, _, left, right in local)
    ranked.sort(key=lambda x: x[0], reverse=True)  # stable: keeps the local order on ties
    return [[left, right] for _, left, right in ranked]


def _byte_level(tokens: list[str], merges: list[list[str]], regexes: tuple[str, ...],
                ignore_merges: bool) -> dict:
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in regexes]
    return {
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            *splits,
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": _bpe(tokens, merges, unk=None, byte_fallback=False, ignore_merges=ignore_merges),
    }


def _sentencepiece_bpe(tokens: list[str], merges: list[list[str]], unk: str | None,
                       add_prefix: bool) -> dict:
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                       replace]}
                  if add_prefix else replace)
    decoders = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if add_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "normalizer": normalizer,
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": _bpe(tokens, merges, unk=unk, byte_fallback=True, ignore_merges=False),
    }


def _bpe(tokens: list[str], merges: list[list[str]], unk: str | None, byte_fallback: bool,
         ignore_merges: bool) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
            "ignore_merges": ignore_merges,
            "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}


def _template(bos: str | None, bos_id: int | None, eos: str | None,
              eos_id: int | None) -> dict:
    """Post-processor adding bos/eos around each sequence (what add_bos/add_eos ask)."""
    def seq(name: str, type_id: int) -> list[dict]:
        out = [{"SpecialToken": {"id": bos, "type_id": type_id}}] if bos is not None else []
        out.append({"Sequence": {"id": name, "type_id": type_id}})
        if eos is not None:
            out.append({"SpecialToken": {"id": eos, "type_id": type_id}})
        return out

    specials = {}
    for tok, tid in ((bos, bos_id), (eos, eos_id)):
        if tok is not None:
            specials[tok] = {"id": tok, "ids": [tid], "tokens": [tok]}
    return {"type": "TemplateProcessing", "single": seq("A", 0),
            "pair": seq("A", 0) + seq("B", 1), "special_tokens": specials}
