"""Prefix reuse across calls (edgellm/cache/prompt_cache.py): the same logits and greedy ids as a
full prefill, sliding windows reused exactly as far as they hold, an LRU within its budget."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import reference

from edgellm.cache.kv_cache import truncatable
from edgellm.llm import LLM

NAMES = ["llama", "mistral-swa", "gemma3"]  # full attention, sliding window 16, both mixed


def _ids(name: str) -> list[int]:
    return [int(i) for i in reference(name)["input_ids"]]


def _greedy(llm: LLM, prompt: list[int], n: int = 10) -> list[int]:
    return [c.token for c in llm.stream_ids(prompt, max_tokens=n, temperature=0)
            if c.token is not None]


@pytest.mark.parametrize("name", NAMES)
def test_reused_prefix_gives_the_full_prefills_logits(converted, name):
    ids = _ids(name)
    with LLM(converted(name), context=64, chunk=16, kv_type="f32") as llm:
        full = llm.logits(ids)
        llm.model.reset()
        llm.model.forward(ids[:25], want="none")
        rest = llm.prompt_cache.prepare(ids)  # the live cache holds ids[:25]
        assert llm.prompt_cache.reused == 25 and rest == ids[25:]
        np.testing.assert_allclose(llm.model.forward(rest, want="all"), full[25:], atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_ids_with_reuse_are_the_cold_ones(converted, name):
    ids = _ids(name)
    a, b = ids[:30], ids[:30] + ids[3:9]
    with LLM(converted(name), context=64, chunk=16) as cold:
        want_a = _greedy(cold, a)
        cold.model.reset()
        want_b = _greedy(cold, b)
        cold.model.reset()
        cont = a + want_a[:-1] + ids[10:14]  # a conversation re-sent with more at its end
        want_cont = _greedy(cold, cont)
    with LLM(converted(name), context=64, chunk=16) as llm:
        assert _greedy(llm, a) == want_a
        assert _greedy(llm, cont) == want_cont
        assert llm.prompt_cache.reused == len(a) + len(want_a) - 1  # all it held
        assert _greedy(llm, b) == want_b
        windowed = any(layer.window for layer in llm.model.cache.layers)
        # a cut back past what a wrapped 16-token window holds cannot be reused
        assert llm.prompt_cache.reused == (0 if windowed else 30)


@pytest.mark.parametrize("name", ["llama", "mistral-swa"])
def test_lru_reuses_two_alternating_prompts(converted, name):
    ids = _ids(name)
    sys_a, sys_b = ids[:24], ids[16:40]
    with LLM(converted(name), context=64, chunk=16, prompt_cache_bytes=1 << 20) as llm:
        reused = []
        for p in (sys_a, sys_b, sys_a + [5, 6], sys_b + [5, 6], sys_a + [7], sys_b + [7]):
            with LLM(converted(name), context=64, chunk=16) as cold:
                assert _greedy(llm, p) == _greedy(cold, p)
            reused.append(llm.prompt_cache.reused)
        # each system prompt's snapshot (taken when the other replaced it, or, with sliding
        # windows, when it was prefilled) serves it again
        assert reused[:2] == [0, 0] and min(reused[2:]) >= 24
        assert 0 < llm.prompt_cache.nbytes <= 1 << 20


def test_lru_stays_within_its_budget(converted):
    ids = _ids("llama")
    with LLM(converted("llama"), context=64, chunk=16) as llm:
        llm.model.forward(ids[:20], want="none")
        one = llm.model.cache.state().nbytes
    with LLM(converted("llama"), context=64, chunk=16, prompt_cache_bytes=int(one * 2.5)) as llm:
        for k in range(5):
            _greedy(llm, ids[k:k + 20], n=1)
        assert len(llm.prompt_cache.entries) == 2
        assert llm.prompt_cache.nbytes <= one * 2.5
    with LLM(converted("llama"), context=64, chunk=16) as llm:  # default: no snapshots
        _greedy(llm, ids[:20], n=1)
        _greedy(llm, ids[5:25], n=1)
        assert not llm.prompt_cache.entries


def test_truncatable_follows_the_window():
    # one sliding layer of window 16 (16 slots), one full layer, 40 tokens written
    win, caps = [16, 0], [16, 64]
    assert truncatable(win, caps, [40, 40], 40, 40, 40)  # continue where it stopped
    assert truncatable(win, caps, [40, 40], 40, 40, 39)  # 24..38 are still held
    assert not truncatable(win, caps, [40, 40], 40, 40, 38)  # needs 23, overwritten
    assert truncatable(win, caps, [12, 12], 12, 12, 3)  # never wrapped: any cut
    assert not truncatable([0], [64], [30], 34, 30, 10)  # shifted: positions moved
    assert truncatable([0], [64], [30], 30, 30, 0)
