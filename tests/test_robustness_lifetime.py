"""Object lifetimes and concurrent use of one LLM (lifetime.py): a closed LLM, its streams
and chat sessions raise ClosedError and never run a kernel over unmapped memory; an LLM
runs one generation at a time, so threads get the outputs they would get alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import edgellm
from edgellm.errors import BusyError, ClosedError, SupersededError

ROOT = Path(__file__).resolve().parents[1]
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def path(converted):
    return converted("llama", "q8_0")


@pytest.fixture(scope="module")
def llm(path):
    with edgellm.load(path) as m:
        yield m


# A script per case: it must print the typed error's name and exit 0 (a SIGSEGV before).
AFTER_CLOSE = {
    "stream_then_close": """
s = llm.stream("hi", max_tokens=50, temperature=0)
next(s)
llm.close()
list(s)
""",
    "stream_after_with_block": """
with edgellm.load(PATH) as m:
    s = m.stream("hi", max_tokens=50, temperature=0)
    next(s)
list(s)
""",
    "unstarted_stream_after_close": """
s = llm.stream("hi", max_tokens=5)
llm.close()
next(s)
""",
    "generate_after_close": "llm.close(); llm.generate('hi', max_tokens=2)",
    "logits_after_close": "llm.close(); llm.logits([1, 2])",
    "stream_after_close": "llm.close(); llm.stream([1, 2])",
    "tokenizer_after_close": "llm.close(); llm.tokenizer",
    "template_after_close": "llm.close(); llm.apply_chat_template([{'role': 'user', 'content': 'x'}])",
    "chat_after_close": """
chat = llm.chat()
chat.ask("hello", max_tokens=3)
llm.close()
chat.ask("again", max_tokens=3)
""",
    "chat_stream_then_close": """
chat = llm.chat()
s = chat.send("hello", max_tokens=50, temperature=0)
next(s)
llm.close()
list(s)
""",
    "close_from_another_thread": """
import threading
s = llm.stream("hi", max_tokens=10**6, temperature=0)
next(s)
threading.Timer(0.2, llm.close).start()
for _ in s:
    pass
""",
}


def run_case(path: Path, code: str) -> subprocess.CompletedProcess:
    script = (f"import edgellm\nPATH = {str(path)!r}\nllm = edgellm.load(PATH)\n"
              f"try:\n" + "".join(f"    {line}\n" for line in code.strip().splitlines())
              + "except edgellm.EdgeLLMError as e:\n    print(type(e).__name__, e)\n"
              "else:\n    print('no error')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("case", sorted(AFTER_CLOSE))
def test_a_closed_llm_raises_closed_error(case, path):
    r = run_case(path, AFTER_CLOSE[case])
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # -11: SIGSEGV
    assert r.stdout.startswith("ClosedError "), (r.stdout, r.stderr[-2000:])
    assert "Traceback" not in r.stderr


def test_close_is_idempotent_and_says_closed(path):
    m = edgellm.load(path)
    assert not m.closed
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(ClosedError, match="closed"):
        m.context  # noqa: B018


# ----------------------------------------------------------------------------- threads

PROMPTS = ["the quick brown fox", "once upon a time", "def main():", "1, 2, 3, 4,"]


def test_two_threads_get_their_sequential_outputs(llm):
    """Two threads x 4 rounds of greedy generation on one LLM: each output equals the one
    generated alone (before the lock: wrong text, or 'act holds 5 quantized rows')."""
    expected = {p: llm.generate(p, **GREEDY) for p in PROMPTS}
    got: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    errors = []
    start = threading.Barrier(2)

    def worker(k: int) -> None:
        try:
            start.wait()
            for r in range(4):
                p = PROMPTS[(k * 2 + r) % len(PROMPTS)]
                got[k].append((p, llm.generate(p, **GREEDY)))
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for k in (0, 1):
        assert len(got[k]) == 4
        for p, text in got[k]:
            assert text == expected[p], (p, text, expected[p])


def test_threads_streaming_token_by_token(llm):
    """Streams in two threads, consumed a token at a time with sleeps between: never
    interleaved (the second waits for the first stream to end)."""
    expected = {p: llm.generate(p, **GREEDY) for p in PROMPTS[:2]}
    got = {}

    def worker(p: str) -> None:
        parts = []
        for chunk in llm.stream(p, **GREEDY):
            parts.append(chunk.text)
            time.sleep(0.001)
        got[p] = "".join(parts)

    threads = [threading.Thread(target=worker, args=(p,)) for p in PROMPTS[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == expected


def test_two_live_streams_in_one_thread(llm):
    """Starting a second stream while the first is live ends the first (SupersededError
    at its next step); the second is exactly what it is alone (before: both corrupt)."""
    a, b = PROMPTS[:2]
    alone_a = [c.text for c in llm.stream(a, **GREEDY)]
    alone_b = llm.generate(b, **GREEDY)
    s1 = llm.stream(a, **GREEDY)
    first = next(s1).text
    s2 = llm.stream(b, **GREEDY)
    assert "".join(c.text for c in s2) == alone_b
    with pytest.raises(SupersededError, match="newer generation"):
        next(s1)
    assert first == alone_a[0]
    with pytest.raises(StopIteration):  # ended for good, and the model is free again
        next(s1)
    assert llm.generate(a, **GREEDY) == "".join(alone_a)


def test_busy_when_asked_not_to_wait(llm):
    held = threading.Event()
    done = threading.Event()

    def holder() -> None:
        with llm.stream(PROMPTS[0], **GREEDY) as s:
            next(s)
            held.set()
            done.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(60)
        with pytest.raises(BusyError, match="busy"):
            llm.generate("x", blocking=False, **GREEDY)
        t0 = time.monotonic()
        with pytest.raises(BusyError):
            llm.logits([1, 2], timeout=0.2)
        assert time.monotonic() - t0 >= 0.2
    finally:
        done.set()
        t.join(60)
    assert llm.generate("x", blocking=False, **GREEDY) == llm.generate("x", **GREEDY)


def test_a_waiting_thread_gets_its_turn_when_the_stream_ends(llm):
    s = llm.stream(PROMPTS[0], **GREEDY)
    next(s)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("x", llm.generate(PROMPTS[1],
                                                                          **GREEDY)))
    t.start()
    time.sleep(0.3)
    assert "x" not in out  # waiting: the stream holds the model
    rest = list(s)  # the stream finishes undisturbed
    assert rest[-1].finish_reason is not None
    t.join(60)
    assert out["x"] == llm.generate(PROMPTS[1], **GREEDY)


def test_chat_session_after_another_generation_is_still_right(llm):
    """A generate() between two chat turns takes the cache; the next turn prefills the
    conversation again (before: only the new message, after the other prompt's tokens)
    and answers as a session given the same history from scratch does."""
    chat = llm.chat(system="be brief")
    chat.ask("hello", **GREEDY)
    history = list(chat.messages)
    llm.generate("something else entirely", **GREEDY)
    answer = chat.ask("and then?", **GREEDY)
    text = llm.apply_chat_template(history + [{"role": "user", "content": "and then?"}])
    assert llm.tokenizer.decode(llm.model.tokens).startswith(text)
    fresh = llm.chat(system="be brief")
    fresh.messages = history
    assert fresh.ask("and then?", **GREEDY) == answer
