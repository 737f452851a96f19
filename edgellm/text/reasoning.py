"""Reasoning kept apart from the answer: <think>...</think> blocks in streamed text.

Templates with thinking (Qwen3, DeepSeek-R1) let the model open `<think>` itself, or open it
in the generation prompt (the output then starts inside the block). `ReasoningSplitter`
turns streamed text into ("reasoning", text) and ("content", text) pieces, holding back a
possible tag split across chunks.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def supports_thinking(template: str | None) -> bool:
    """Whether a chat template's source speaks of <think> blocks."""
    return bool(template) and OPEN in template and CLOSE in template


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open <think> block."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Splits streamed text at <think> / </think>. A <think> counts only before any answer
    text (leading whitespace aside); `inside` says where the next text goes."""

    def __init__(self, inside: bool = False):
        self.inside = inside
        self.seen_content = False
        self._held = ""
        self._skip_newlines = inside  # the newlines that follow a tag belong to neither

    def feed(self, text: str) -> list[tuple[str, str]]:
        """Pieces [(kind, text)] of `text`, kind "reasoning" or "content"."""
        buf, out = self._held + text, []
        self._held = ""
        while buf:
            if self._skip_newlines:
                buf = buf.lstrip("\n")
                if not buf:
                    break
                self._skip_newlines = False
            if self.inside:
                i = buf.find(CLOSE)
                if i >= 0:
                    out.append(("reasoning", buf[:i]))
                    buf = buf[i + len(CLOSE):]
                    self.inside = False
                    self._skip_newlines = True
                    continue
                hold = _partial_suffix(buf, CLOSE)
                out.append(("reasoning", buf[:len(buf) - hold]))
                self._held = buf[len(buf) - hold:]
                break
            if not self.seen_content:
                stripped = buf.lstrip()
                if stripped.startswith(OPEN):
                    buf = stripped[len(OPEN):]
                    self.inside = True
                    self._skip_newlines = True
                    continue
                if OPEN.startswith(stripped):  # maybe the start of <think>: wait
                    self._held = buf
                    break
                self.seen_content = True
                buf = stripped
            out.append(("content", buf))
            break
        return [(k, t) for k, t in out if t]

    def flush(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        if not held:
            return []
        return [("reasoning" if self.inside else "content", held)]
