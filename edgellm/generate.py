"""The generation loop: prefill, then sample and decode one token at a time, streaming text.

`generate_step` yields token ids (mlx-lm's shape); `stream` wraps it with the detokenizer,
stop strings and statistics, yielding `Chunk`s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import ContextError
from .kernels.token_mask import mask_logits
from .sampling import Sampler

if TYPE_CHECKING:
    from .text.constraints import Constraint
from .text.tokenizer import StreamingDetokenizer, Tokenizer


@dataclass
class Stats:
    """Counts and speeds of one generation."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    proposed_tokens: int = 0  # speculative decoding: tokens guessed, and those accepted
    accepted_tokens: int = 0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first token comes from the prefill's logits: n-1 decode steps produce the rest
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_s if self.decode_s and steps else 0.0

    @property
    def acceptance(self) -> float:
        """The share of guessed tokens accepted (speculative decoding; 0 without)."""
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else 0.0

    def line(self) -> str:
        spec = (f"; guessed {self.proposed_tokens} tokens, accepted {self.accepted_tokens}"
                if self.proposed_tokens else "")
        return (f"prompt {self.prompt_tokens} tokens, {self.prefill_tok_s:.1f} tok/s; "
                f"generated {self.generated_tokens} tokens, {self.decode_tok_s:.1f} tok/s; "
                f"first token after {self.ttft_s * 1000:.0f} ms{spec}")


@dataclass
class Chunk:
    """A piece of streamed output. The last chunk has `finish_reason` and `stats`."""

    text: str
    token: int | None
    finish_reason: str | None = None  # "stop" (end of sequence or stop string), "length"
    stats: Stats | None = None
    stop: str | None = None  # on the last chunk: the stop string that ended it, if one did


class StopMatcher:
    """Cuts text at the first stop string, even when it spans several chunks: text that
    could still start a stop string is held back until it cannot."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit: str | None = None  # the stop string reached (the first in the text)

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was reached)."""
        buf = self.pending + text
        if not self.stops:
            self.pending = ""
            return buf, False
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.pending = ""
            at, self.hit = min(hits, key=lambda h: h[0])
            return buf[:at], True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def generate_step(model, prompt: np.ndarray, sampler: Sampler, history: list[int],
                  shift: bool = True, constraint: Constraint | None = None,
                  limit: int | None = None, eos=()) -> Iterator[int]:
    """Prefill `prompt` after what the cache holds, then yield sampled ids forever.

    The caller stops the iteration; each id it pulls after the first is decoded (fed to the
    model) before the next is sampled. `history` (prompt so far) grows with each id.
    With a `constraint`, each id is drawn from the tokens its mask allows and consumed by it
    before it is yielded; the next mask is computed while the model runs the id.
    A server's slot (batch.SlotModel) runs an unconstrained generation ahead of the caller,
    sampling on its engine (run_ahead): `limit` (the most ids the caller takes) and `eos`
    (ids it stops at) spare it the rows of ids the caller will not pull past.
    """
    run_ahead = getattr(model, "run_ahead", None)
    if constraint is None and run_ahead is not None:
        logits = model.forward(prompt, want="last", shift=shift)
        yield from run_ahead(logits, sampler, history, shift, limit, eos)
        return
    if constraint is None:
        logits = model.forward(prompt, want="last", shift=shift)
        while True:
            token = sampler.sample(logits, history)
            history.append(token)
            yield token
            logits = model.forward(np.array([token], np.int64), want="last", shift=shift)
    constraint.fill_async()
    logits = model.forward(prompt, want="last", shift=shift)
    while True:
        constraint.wait()
        mask_logits(logits, constraint.mask)  # the model's buffer, ours until the next forward
        token = sampler.sample(logits, history)
        constraint.advance(token)
        history.append(token)
        yield token
        constraint.fill_async()
        logits = model.forward(np.array([token], np.int64), want="last", shift=shift)


def stream(model, tokenizer: Tokenizer, prompt: Sequence[int], sampler: Sampler,
           max_tokens: int, stop: Sequence[str] = (), shift: bool = True,
           history: list[int] | None = None,
           constraint: Constraint | None = None, spec=None) -> Iterator[Chunk]:
    """Generate from `prompt` (ids to run after the cache's contents), as Chunks.

    Ends on an end-of-sequence id ("stop", its text not emitted), a stop string ("stop",
    nothing from the stop string on emitted), a `constraint` that is complete and can take
    no more ("stop"), `max_tokens` ("length": constrained output may then be incomplete),
    or a full context when `shift` is False ("length"). The last sampled id is never run through the model:
    `model.tokens` lists what the cache holds afterwards. `spec`: a speculative.Speculation
    to decode with (the same ids, several a step; Stats counts its guesses).
    """
    prompt = np.asarray(prompt, dtype=np.int64)
    if not shift and model.cache.room() < prompt.size + 1:
        held = len(model.tokens)  # the prompt's start the cache already holds, if any
        raise ContextError(f"prompt of {held + prompt.size} tokens does not fit the context "
                           f"of {model.context} ({prompt.size} after the {held} the cache "
                           f"holds; room for {model.cache.room()})" if held else
                           f"prompt of {prompt.size} tokens does not fit the context of "
                           f"{model.context} (room for {model.cache.room()})")
    stats = Stats(prompt_tokens=int(prompt.size))
    history = list(prompt) if history is None else history
    detok = StreamingDetokenizer(tokenizer)
    stopper = StopMatcher(stop)
    t0 = time.perf_counter()
    if spec is not None:
        from .speculative import speculative_steps

        steps = speculative_steps(model, prompt, sampler, history, shift, constraint,
                                  max_tokens, tokenizer.eos_ids, spec)
    else:
        steps = generate_step(model, prompt, sampler, history, shift, constraint, max_tokens,
                              tokenizer.eos_ids)

    def counted(st: Stats) -> Stats:
        if spec is not None:
            st.proposed_tokens, st.accepted_tokens = spec.proposed, spec.accepted
        return st

    finish = "length"
    t_first = t0
    if max_tokens <= 0:
        yield Chunk("", None, "length", stats)
        return
    for n, token in enumerate(steps):
        if n == 0:
            t_first = time.perf_counter()
            stats.prefill_s = stats.ttft_s = t_first - t0
        if token in tokenizer.eos_ids:
            finish = "stop"
            break
        stats.generated_tokens += 1
        text, stopped = stopper.feed(detok.add(token))
        if not stopped and constraint is not None and constraint.is_done():
            tail, stopped = stopper.feed(detok.flush())
            text += tail if stopped else tail + stopper.flush()
            stopped = True
        if stopped:
            finish = "stop"
            yield Chunk(text, token)
            break
        last = stats.generated_tokens >= max_tokens
        if not last and not shift and model.cache.room() < 1:
            last = True
        if last:
            tail, stopped = stopper.feed(detok.flush())
            text += tail if stopped else tail + stopper.flush()
            stats.decode_s = time.perf_counter() - t_first
            steps.close()
            yield Chunk(text, token, "stop" if stopped else "length", counted(stats),
                        stopper.hit)
            return
        yield Chunk(text, token)  # one chunk per token; text may be "" (an unfinished char)
    stats.decode_s = time.perf_counter() - t_first
    text = ""
    if finish == "length":
        text, _ = stopper.feed(detok.flush())
        text += stopper.flush()
    steps.close()
    yield Chunk(text, None, finish, counted(stats), stopper.hit)
