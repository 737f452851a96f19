"""Clients arriving together with one cached prefix (the server's burst): each restores it on
its own thread while the engine runs the others' rounds; a sequence the cache already holds
but for a few tokens is not copied into it again; short prompts beside decode rows finish
in the round they join; greedy answers stay those of a cold prefill."""

from __future__ import annotations

import threading

import numpy as np
from conftest import reference

import edgellm
from edgellm.batch import Batch, _Job


def _ids() -> tuple[list[int], list[int]]:
    """The llama fixture's ids, and a 100-token prefix made of them."""
    ids = [int(t) for t in reference("llama")["input_ids"]]
    return ids, (ids * 20)[:100]


def _greedy(slot, prompt: list[int]) -> list[int]:
    return [c.token for c in slot.stream_ids(prompt, max_tokens=6, temperature=0)]


def _cold(llm, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    for p in prompts:
        llm.model.reset()
        out.append(_greedy(llm, p))
    return out


def test_a_restore_does_not_wait_for_the_engines_round(converted):
    """The engine busy (a call holding it): a slot still restores the cached prefix, on
    its own thread, and its answer is the cold one."""
    ids, prefix = _ids()
    prompts = [prefix + ids[1:4], prefix + ids[4:9]]
    with edgellm.load(converted("llama", "q4_1"), context=256, threads=2) as llm:
        cold = _cold(llm, prompts)
        batch = Batch(llm, 2, prompt_cache_bytes=64 << 20)
        try:
            a, b = batch.slots
            assert _greedy(a, prompts[0]) == cold[0]
            busy, gate = threading.Event(), threading.Event()
            batch.enqueue(_Job(fn=lambda: (busy.set(), gate.wait(60))))
            assert busy.wait(60)
            rest = []
            t = threading.Thread(target=lambda: rest.append(b.prompt_cache.prepare(
                prompts[1])))
            t.start()
            t.join(20)
            restored = not t.is_alive()
            gate.set()
            t.join()
            assert restored, "the restore waited for the engine's round"
            assert b.prompt_cache.reused >= 100 and rest[0] == prompts[1][b.prompt_cache.reused:]
            b.model.reset()
            assert _greedy(b, prompts[1]) == cold[1]  # restored again, then prefilled
        finally:
            gate.set()
            batch.close()


def test_a_sequence_cached_but_for_a_few_tokens_is_not_copied_again(converted):
    ids, prefix = _ids()
    prompts = [prefix + ids[1:4], prefix + ids[4:9], prefix + (ids[::-1] * 3)[:40]]
    with edgellm.load(converted("llama", "q4_1"), context=256, threads=2) as llm:
        cold = _cold(llm, prompts)
        batch = Batch(llm, 2, prompt_cache_bytes=64 << 20)
        try:
            a, b = batch.slots
            lru = batch.prompt_cache
            assert _greedy(a, prompts[0]) == cold[0]
            batch.call(lambda: None)  # (an engine that files the offers: they have run)
            assert len(lru.entries) == 1
            assert _greedy(b, prompts[1]) == cold[1]
            assert b.prompt_cache.reused >= 100
            batch.call(lambda: None)
            assert len(lru.entries) == 1  # its ~110 tokens: all but 11 cached already
            assert _greedy(b, prompts[2]) == cold[2]
            batch.call(lambda: None)
            assert len(lru.entries) == 2  # 46 new tokens of 146: kept
        finally:
            batch.close()


def test_short_prompts_beside_decode_rows_finish_in_one_round(converted):
    """Three 10-token prompts and a decode row taken in one round (the engine held by a
    call while they queue): the prompts run whole in it, not a quarter chunk a round."""
    ids, prefix = _ids()
    with edgellm.load(converted("llama", "q4_1"), context=128, threads=2) as llm:
        batch = Batch(llm, 4)
        chunk = batch.model.chunk
        try:
            assert chunk // 4 >= 10 and 30 > chunk // 4
            slots = [s.model for s in batch.slots]
            assert _greedy(batch.slots[0], ids[:8])
            busy, gate = threading.Event(), threading.Event()
            batch.enqueue(_Job(fn=lambda: (busy.set(), gate.wait(60))))
            assert busy.wait(60)
            rounds = batch.prefill_rounds
            decode = _Job(slots[0], np.array([ids[9]], np.int64), "last")
            prompts = [_Job(v, np.array(ids[k:k + 10], np.int64), "last")
                       for k, v in zip((1, 3, 5), slots[1:])]
            for job in (decode, *prompts):
                batch.enqueue(job)
            gate.set()
            for job in (decode, *prompts):
                assert job.wait().shape == (llm.model.args.vocab_size,)
            assert batch.prefill_rounds - rounds == 1
        finally:
            gate.set()
            batch.close()
