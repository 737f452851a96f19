"""A multi-turn chat that keeps its KV cache: each turn prefills only its new tokens."""

from __future__ import annotations

from collections.abc import Iterator

from . import arguments
from .generate import Chunk


class ChatSession:
    """Messages so far, and the model's cache holding them.

    A turn renders the whole conversation with the chat template. When the text the cache
    already holds is a prefix of it, only the rest is tokenized and prefilled; otherwise
    the cache is cut back to the longest common prefix of token ids (or reset).

    A turn holds its LLM's generation lock (lifetime.py) from `send` until its stream
    ends; when another generation used the cache in between, the next turn prefills the
    conversation again rather than trust the cache. After llm.close(), every method raises
    ClosedError.
    """

    def __init__(self, llm, system: str | None = None, parse_special: bool = False):
        self.llm = llm
        self.system = system
        self.parse_special = parse_special  # special-token text in messages: tokens, not text
        self.messages = [{"role": "system", "content": system}] if system else []
        self.cached_text = ""  # the text the model's cache holds (if it holds our tokens)
        self.last_prefill_tokens = 0
        # the model is left alone until the first turn (which keeps what prefix it can):
        # making a chat takes no turn, so it neither waits nor ends a live stream

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        with self.llm.lifetime.exclusive(owner=self):
            self.llm._model().reset()
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.cached_text = ""

    def _new_tokens(self, text: str, literal: list[tuple[int, int]], turn) -> list[int]:
        """The ids to prefill so that the cache holds `text` (under `turn`), the special
        tokens' text inside the `literal` spans read as text."""
        model, llm = self.llm._model(), self.llm
        if turn.previous_owner is not self:  # another generation used the cache since
            self.cached_text = ""
        if self.cached_text and text.startswith(self.cached_text) and model.tokens:
            cut = len(self.cached_text)
            return llm._encode(text[cut:], literal=[(a - cut, b - cut) for a, b in literal
                                                    if a >= cut])
        ids = llm._encode(text, literal=literal)
        common = 0
        for a, b in zip(model.tokens, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)
        model.truncate(common)
        return ids[len(model.tokens):]

    def send(self, message: str, *, blocking: bool = True, timeout: float | None = None,
             **sampling) -> Iterator[Chunk]:
        """Add a user message and stream the assistant's answer (recorded when done).
        blocking, timeout: as LLM.stream."""
        arguments.text(message, "message")
        llm = self.llm
        text, literal = llm._chat_text(self.messages + [{"role": "user", "content": message}],
                                       True, self.parse_special)
        turn = llm.lifetime.acquire(blocking, timeout, owner=self)
        try:
            ids = self._new_tokens(text, literal, turn)
            chunks = llm.stream_ids(ids, keep_cache=True, _turn=turn, **sampling)
        except BaseException:
            llm.lifetime.release(turn)
            raise
        self.last_prefill_tokens = len(ids)
        return llm.lifetime.stream(turn, self._record(chunks, llm._model(), turn, message))

    def _record(self, chunks: Iterator[Chunk], model, turn, message: str) -> Iterator[Chunk]:
        """The turn's chunks; the user's message and the answer go into .messages once the
        stream starts, and come off again if it fails before its first token (a prompt past
        the context, say): a turn that did not happen leaves no trace in the history."""
        self.messages.append({"role": "user", "content": message})
        answer, said, failed = [], False, False
        try:
            for chunk in chunks:
                answer.append(chunk.text)
                said = said or chunk.token is not None
                yield chunk
        except BaseException:
            failed = not said
            raise
        finally:  # also when the caller stops early (Ctrl-C): keep what was said
            chunks.close()
            if failed:
                self.messages.pop()
            else:
                self.messages.append({"role": "assistant", "content": "".join(answer)})
            # what the cache holds now, unless the model was closed or taken meanwhile
            self.cached_text = (self.llm.tokenizer.decode(model.tokens)
                                if turn.ended is None else "")

    def save(self, path) -> None:
        """Save the conversation and the cache that holds it (session.py), under a turn of
        the model (the cache must not move while written). If another generation has used
        the model since this chat's last turn, the cache holds its tokens, not this chat's:
        it is emptied and the conversation saved without it (prefilled again after load)."""
        from .cache.session import save_session

        with self.llm.lifetime.exclusive(owner=self) as turn:
            if turn.previous_owner is not self or not self.cached_text:
                self.llm._model().reset()
                self.cached_text = ""
            save_session(self.llm, path, {"system": self.system, "messages": self.messages})

    @classmethod
    def load(cls, llm, path, parse_special: bool = False) -> ChatSession:
        """The conversation saved at `path`, its cache read back in under a turn of the
        model (SessionError, and the model unchanged, if the file is bad or belongs to
        another model or setup)."""
        from .cache.session import apply, read_session
        from .errors import SessionError

        chat = cls(llm, parse_special=parse_special)
        with llm.lifetime.exclusive(owner=chat):
            saved = read_session(llm, path)
            system = (saved.chat or {}).get("system")
            if saved.chat is None or not (system is None or isinstance(system, str)):
                raise SessionError(f"{path}: not a chat session (no messages saved)")
            apply(llm, saved)
            chat.system, chat.messages = system, saved.messages
            chat.cached_text = llm.tokenizer.decode(llm.model.tokens) if saved.tokens else ""
        return chat

    def ask(self, message: str, **sampling) -> str:
        """send() collected into one string."""
        with self.send(message, **sampling) as chunks:
            return "".join(c.text for c in chunks)
