"""Tokenizer: a thin wrapper over Hugging Face `tokenizers`, and a streaming detokenizer.

The wrapper is built from the strings a model ships (tokenizer.json, tokenizer_config.json,
generation_config.json) and behaves like transformers' fast tokenizer:

- `encode(text)` adds no special tokens; `encode(text, add_special_tokens=True)` uses the
  tokenizer.json post-processor unless tokenizer_config sets `add_bos_token` /
  `add_eos_token`, in which case the result is `[bos]? + ids + [eos]?`, as transformers'
  `update_post_processor` rebuilds it.
- `encode(text, literal=spans)` tokenizes the special tokens' text inside the spans as text
  (as llama.cpp's parse_special=false does for user text), in context with its
  neighbours; special tokens elsewhere stay control tokens. How: a copy of the tokenizer in
  which each special token has an alias, a non-special added token with the same matching
  flags; outside the spans each special token is written as its alias, and the text is
  encoded with `encode_special_tokens` (special tokens not split off: BPE'd as text).
- `decode` never applies `clean_up_tokenization_spaces`: transformers (>= 5.7) skips it for
  BPE tokenizers, which every model we run uses.
"""

from __future__ import annotations

import functools
import re
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence

import tokenizers

from edgellm.errors import TokenizerError
from edgellm.modelfile import tokenizer_store

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
_REPLACEMENT = "\ufffd"


def _token_content(value: object) -> str | None:
    """A special token as tokenizer_config stores it: a string or {"content": str}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_list(value: object) -> list[int]:
    """generation_config ids: an int, a list of ints, or absent."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _encode(backend: tokenizers.Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """backend.encode(text).ids through encode_batch, which lets go of the interpreter's lock
    while it works (encode holds it: a long prompt would stop every other thread, the
    server's engine and requests among them, for as long as it takes). Same ids."""
    return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids


class Tokenizer:
    """Text <-> token ids for one model."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        tokenizer_config: Mapping | None = None,
        generation_config: Mapping | None = None,
    ) -> None:
        self._tok = backend
        # tokenizer.json may carry training-time truncation/padding; transformers turns them
        # off for a plain call, and so do we.
        self._tok.no_truncation()
        self._tok.no_padding()
        config = dict(tokenizer_config or {})
        gen = dict(generation_config or {})

        self.special_tokens: dict[str, str] = {}
        for key in SPECIAL_TOKEN_KEYS:
            content = _token_content(config.get(key))
            if content is None:  # fall back on the id generation_config names
                ids = _as_id_list(gen.get(f"{key}_id"))
                content = self._tok.id_to_token(ids[0]) if ids else None
            if content is not None:
                self.special_tokens[key] = content

        self.bos_token = self.special_tokens.get("bos_token")
        self.eos_token = self.special_tokens.get("eos_token")
        self.bos_id = self.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_id = self.token_to_id(self.eos_token) if self.eos_token else None
        eos = {self.eos_id} if self.eos_id is not None else set()
        eos.update(i for i in _as_id_list(gen.get("eos_token_id")) if 0 <= i < self.vocab_size)
        self.eos_ids: frozenset[int] = frozenset(eos)

        self._literal = None  # (backend with aliases, pattern, alias ids -> ids): on first use
        self._literal_lock = threading.Lock()
        self._add_bos = config.get("add_bos_token")
        self._add_eos = config.get("add_eos_token")
        if self._add_bos and self.bos_id is None:
            raise TokenizerError("tokenizer_config sets add_bos_token but has no usable bos_token")
        if self._add_eos and self.eos_id is None:
            raise TokenizerError("tokenizer_config sets add_eos_token but has no usable eos_token")

    @classmethod
    def from_json(
        cls,
        tokenizer_json: str | None,
        tokenizer_config: Mapping | None = None,
        generation_config: Mapping | None = None,
    ) -> Tokenizer:
        """Build from the text of tokenizer.json and the parsed config dicts."""
        if not tokenizer_json or not isinstance(tokenizer_json, str):
            raise TokenizerError("tokenizer.json is missing or empty")
        try:
            backend = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # tokenizers raises a bare Exception
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise TokenizerError(f"tokenizer.json is invalid: {first}") from None
        finally:
            tokenizer_store.release_freed_memory()  # the JSON parse's transient
        return cls(backend, tokenizer_config, generation_config)

    @classmethod
    def from_packed(cls, packed) -> Tokenizer:
        """Build from a packed file (format.PackedModel): its stored tokenizer (version 2)
        or the tokenizer.json text in its header."""
        if packed.tokenizer_stored:
            backend = tokenizer_store.build(*packed.tokenizer_bytes())
            return cls(backend, packed.tokenizer_config, packed.generation_config)
        return cls.from_json(packed.tokenizer_json, packed.tokenizer_config,
                             packed.generation_config)

    def to_json(self) -> str:
        """tokenizer.json text of this tokenizer (e.g. for the constraint engine)."""
        return self._tok.to_str()

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @functools.cached_property
    def special_texts(self) -> tuple[str, ...]:
        """The text of every special (control) token: added tokens marked special."""
        return tuple(t.content for t in self._tok.get_added_tokens_decoder().values()
                     if t.special and t.content)

    def encode(self, text: str, add_special_tokens: bool = False,
               literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """text -> ids [n]. Special-token text in `text` maps to its id, except inside the
        `literal` spans [(start, end), ...] of text, where it is tokenized as text."""
        if literal:
            if add_special_tokens:
                raise ValueError("literal spans are for text without added special tokens")
            return self._encode_literal(text, literal)
        if add_special_tokens and (self._add_bos is not None or self._add_eos is not None):
            ids = _encode(self._tok, text, False)
            if self._add_bos:
                ids.insert(0, self.bos_id)
            if self._add_eos:
                ids.append(self.eos_id)
            return ids
        return _encode(self._tok, text, add_special_tokens)

    def _literal_backend(self):
        """(a copy of the backend with a non-special alias for each special token, a
        pattern finding special tokens, {alias id: the special token's id})."""
        with self._literal_lock:
            if self._literal is None:
                backend = tokenizers.Tokenizer.from_str(self._tok.to_str())
                backend.no_truncation()
                backend.no_padding()
                nonce = secrets.token_hex(8)  # an alias no text can contain by chance
                specials = {t.content: (i, t) for i, t in
                            self._tok.get_added_tokens_decoder().items()
                            if t.special and t.content}
                names = {content: f"\ue000{nonce}.{i}\ue001"
                         for content, (i, _) in specials.items()}
                backend.add_tokens([tokenizers.AddedToken(  # at once: one matcher rebuilt
                    names[content], single_word=t.single_word, lstrip=t.lstrip,
                    rstrip=t.rstrip, normalized=t.normalized, special=False)
                    for content, (_, t) in specials.items()])
                aliases = {content: (alias, backend.token_to_id(alias), specials[content][0])
                           for content, alias in names.items()}
                backend.encode_special_tokens = True
                pattern = re.compile("|".join(re.escape(c) for c in sorted(
                    specials, key=len, reverse=True))) if specials else None
                self._literal = (backend, pattern, aliases)
            return self._literal

    def _encode_literal(self, text: str, literal: Sequence[tuple[int, int]]) -> list[int]:
        backend, pattern, aliases = self._literal_backend()
        if pattern is None:
            return self.encode(text)
        inside = sorted(literal)
        out, last, k = [], 0, 0
        for m in pattern.finditer(text):
            while k < len(inside) and inside[k][1] <= m.start():
                k += 1
            if k < len(inside) and inside[k][0] <= m.start() and m.end() <= inside[k][1]:
                continue  # content: stays text, BPE'd with its neighbours
            out += [text[last:m.start()], aliases[m.group(0)][0]]
            last = m.end()
        out.append(text[last:])
        back = {alias_id: i for _, alias_id, i in aliases.values()}
        return [back.get(i, i) for i in _encode(backend, "".join(out), False)]

    def encode_truncated(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        """Each text -> ids with special tokens, at most max_length of them, as transformers'
        `truncation=True` gives: the text's own tokens are cut (from the right) to leave
        room for the special tokens the post-processor (or add_bos/add_eos) adds."""
        custom = self._add_bos is not None or self._add_eos is not None
        n_special = (bool(self._add_bos) + bool(self._add_eos)) if custom \
            else self._tok.num_special_tokens_to_add(False)
        room = max(0, max_length - n_special)
        out = []
        for enc in self._tok.encode_batch(list(texts), add_special_tokens=False):
            ids = enc.ids[:room]
            if custom:
                ids = [self.bos_id] * bool(self._add_bos) + ids + [self.eos_id] * bool(
                    self._add_eos)
            else:
                enc.truncate(room)
                ids = self._tok.post_process(enc, add_special_tokens=True).ids
            out.append(ids)
        return out

    def encodings(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                  max_length: int | None = None) -> list[tokenizers.Encoding]:
        """Each text (with pairs[i] as its second segment) -> the backend's Encoding (ids,
        type_ids, offsets, special_tokens_mask) with the post-processor's special tokens,
        cut to max_length tokens as transformers' truncation=True ("longest_first") cuts:
        a pair loses tokens from its longer side. Encoders' tokenizers have no
        add_bos/add_eos override, so the post-processor alone adds special tokens."""
        firsts = self._tok.encode_batch(list(texts), add_special_tokens=False)
        seconds = self._tok.encode_batch(list(pairs), add_special_tokens=False) \
            if pairs is not None else [None] * len(firsts)
        room = None if max_length is None else max(
            0, max_length - self._tok.num_special_tokens_to_add(pairs is not None))
        out = []
        for a, b in zip(firsts, seconds, strict=True):
            if room is not None:
                n1, n2 = _longest_first(len(a.ids), len(b.ids) if b else 0, room)
                a.truncate(n1)
                if b is not None:
                    b.truncate(n2)
            out.append(self._tok.post_process(a, b, add_special_tokens=True))
        return out

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Token strings joined as the tokenizer's decoder joins them (WordPiece: "##"
        pieces glued to the previous one), as transformers' fast tokenizers do."""
        decoder = self._tok.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """ids [n] -> text. Ids outside the vocabulary decode to nothing, as in `tokenizers`."""
        try:
            return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        except (OverflowError, TypeError) as e:
            raise TokenizerError(f"cannot decode ids: {e}") from None


def _longest_first(n1: int, n2: int, room: int) -> tuple[int, int]:
    """How many tokens of a pair's two sides fit `room`, as the tokenizers library's
    LongestFirst truncation keeps them (n2 = 0: a single text, cut to room)."""
    if n1 + n2 <= room:
        return n1, n2
    if n2 == 0:
        return room, 0
    swap = n1 > n2
    a, b = (n2, n1) if swap else (n1, n2)  # a: the shorter side
    b = a if a > room else max(a, room - a)
    if a + b > room:
        a = room // 2
        b = a + room % 2
    return (b, a) if swap else (a, b)


class StreamingDetokenizer:
    """Turns ids into text one id at a time, emitting text as soon as it is final.

    Invariant: `"".join(add(i) for i in ids) + flush() == tokenizer.decode(ids)` for any ids a
    tokenizer produces from text (and for any ids at all with byte-level BPE).

    How: keep a short window of recent ids and the part of `decode(window)` already emitted;
    each new id re-decodes the window and emits what follows that part, except:
    - trailing U+FFFD chars are held back until a later id shows they are final: they may be
      an unfinished UTF-8 sequence (byte-level BPE: one U+FFFD; byte fallback: one per byte
      of the whole run of byte tokens);
    - if the emitted part itself changed, nothing is emitted: byte fallback decodes a run of
      byte tokens all-or-nothing, so "é" + the first byte of the next char shows as U+FFFD
      x3 until that char is complete.
    The window keeps `context` already-emitted ids, so a leading-space strip (SentencePiece)
    hits old text, not new; once it holds 2 * context ids it is cut back to the last
    `context` when they decode, free of U+FFFD, to a suffix of the window's text that covers
    everything not yet emitted. Each id costs O(context), not O(n) (a run of invalid UTF-8
    keeps the window growing until it ends).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False,
                 context: int = 4) -> None:
        if context < 1:
            raise ValueError("context must be >= 1")
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._context = context
        self._window: list[int] = []
        self._done = ""  # the emitted part of decode(self._window)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def add(self, token_id: int) -> str:
        """Append one id; return the text it completes (often "", never a partial char)."""
        self._window.append(token_id)
        text = self._decode(self._window)
        if not text.startswith(self._done):
            return ""  # a byte-fallback run is unfinished: wait for it
        start = len(self._done)
        end = len(text)
        while end > start and text[end - 1] == _REPLACEMENT:
            end -= 1
        out = text[start:end]
        self._done = text[:end]
        if len(self._window) >= 2 * self._context:
            self._shrink(text)
        return out

    def _shrink(self, text: str) -> None:
        tail_ids = self._window[-self._context:]
        tail = self._decode(tail_ids)
        cut = len(text) - len(tail)
        # A tail with no U+FFFD starts on a character boundary, so cutting there cannot
        # change how the rest decodes (a tail starting mid-character decodes to U+FFFD).
        if _REPLACEMENT not in tail and cut <= len(self._done) and text.endswith(tail):
            self._window = tail_ids
            self._done = self._done[cut:]

    def flush(self) -> str:
        """Return whatever is held back (e.g. an unfinished character as U+FFFD)."""
        text = self._decode(self._window)
        out = text[len(self._done):] if text.startswith(self._done) else ""
        self._done = text
        return out

    def reset(self) -> None:
        """Forget all ids: the next id starts a new text."""
        self._window = []
        self._done = ""
