"""Requests admitted together prefill together: a slot handed to a request
(SlotLLM.begin_generation) and a request still being prepared (Batch.arriving) hold a round
of prompts until their prompt comes (up to GATHER_S, made long here so that no test depends
on the machine's speed); rows in flight are never held for a request being prepared."""

import threading
import time
from contextlib import ExitStack

import pytest

import edgellm
import edgellm.batch as batch_module
from edgellm.batch import Batch

A = [{"role": "user", "content": "Write a short poem about the sea."}]
B = [{"role": "user", "content": "Write a short story about a fox."}]


@pytest.fixture(scope="module")
def llm(smollm2):
    with edgellm.load(smollm2, context=512) as model:
        yield model


@pytest.fixture
def batch(llm, monkeypatch):
    monkeypatch.setattr(batch_module, "GATHER_S", 30.0)
    b = Batch(llm, 2)
    yield b
    b.close()


def _answer(slot, messages, out, key, **kw):
    with slot.stream(messages, max_tokens=3, temperature=0, **kw) as chunks:
        out[key] = [c.token for c in chunks if c.token is not None]


def test_an_acquired_slot_holds_the_round_until_its_prompt_comes(batch):
    out = {}
    a, b = batch.slots
    a.begin_generation()
    b.begin_generation()
    first = threading.Thread(target=_answer, args=(a, A, out, "a"))
    first.start()
    time.sleep(0.3)
    assert batch.prefill_rounds == 0 and "a" not in out  # held: b's prompt is coming
    _answer(b, B, out, "b")
    first.join(60)
    assert len(out["a"]) == len(out["b"]) == 3
    assert batch.prefill_passes >= 1 and batch.prefill_rounds == 1  # both prompts, one round


def test_a_request_being_prepared_holds_a_round_of_prompts(batch):
    out = {}
    a, b = batch.slots
    with batch.arriving():
        a.begin_generation()
        first = threading.Thread(target=_answer, args=(a, A, out, "a"))
        first.start()
        time.sleep(0.3)
        assert batch.prefill_rounds == 0  # held for the request being prepared
        b.begin_generation()
    _answer(b, B, out, "b")
    first.join(60)
    assert len(out["a"]) == len(out["b"]) == 3 and batch.prefill_rounds == 1


def test_rows_in_flight_are_not_held_for_a_request_being_prepared(batch, monkeypatch):
    """a's generation decoding while another request is being prepared: its rounds do not
    wait for that request (each would wait GATHER_S, here 2 s: 23 rounds, 46 s)."""
    monkeypatch.setattr(batch_module, "GATHER_S", 2.0)
    a = batch.slots[0]
    a.begin_generation()
    tokens = []
    with ExitStack() as preparing, a.stream(A, max_tokens=24, temperature=0) as chunks:
        for c in chunks:
            tokens.append(c.token)
            if len(tokens) == 1:  # prefilled: a request starts being prepared
                preparing.enter_context(batch.arriving())
                t0 = time.monotonic()
        elapsed = time.monotonic() - t0
    assert len([t for t in tokens if t is not None]) == 24
    assert elapsed < 15.0, f"23 decode rounds took {elapsed:.1f} s: held for the request"
