"""A snapshot's KV rows restored by mapping its pages, copy-on-write (cache/shared_rows.py):
the restored cache reads the snapshot's own pages, and a write to them, past the shared
prefix or within it after a cut back, changes neither the snapshot nor another cache
restored from it; greedy answers of slots restored from one snapshot are the cold ones."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from conftest import reference

import edgellm
from edgellm.batch import Batch
from edgellm.cache import kv_cache
from edgellm.cache.kv_cache import KVCache
from edgellm.cache.prompt_cache import kept_state
from edgellm.cache.shared_rows import AVAILABLE, RowFile, map_rows

linux = pytest.mark.skipif(not AVAILABLE, reason="maps rows on Linux only (elsewhere copies)")


def _cache(kv_type: str, windows=(0, 0)) -> KVCache:
    inv = [np.full(32, 0.5, np.float32)] * len(windows)
    return KVCache(list(windows), 1024, 2, 64, inv, kv_type=kv_type)


def _fill(cache: KVCache, start: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for layer in cache.layers:
        k, v = rng.standard_normal((2, n, 2, 64), np.float32)
        layer.store(k, v, np.arange(start, start + n))
    cache.next_pos = cache.n_tokens = start + n


def _mapped(a: np.ndarray) -> bool:
    """Whether a's first whole page is a mapping of a snapshot's file."""
    page = -(-a.ctypes.data // 4096) * 4096
    for line in open("/proc/self/maps"):
        span, *rest = line.split()
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= page < hi:
            return "edgellm-kv" in line
    return False


@linux
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("windows", [(0, 0), (0, 256)])
def test_a_restored_cache_writing_changes_neither_the_snapshot_nor_another(kv_type, windows):
    src = _cache(kv_type, windows)
    _fill(src, 0, 300, seed=1)
    snap = kept_state(src)
    want = [(k.copy(), v.copy()) for k, v in zip(snap.k, snap.v)]
    a, b = _cache(kv_type, windows), _cache(kv_type, windows)
    a.restore(snap)
    b.restore(snap)
    assert _mapped(a.layers[0].k) and _mapped(b.layers[1].v)
    for cache in (a, b):
        for layer, (k, v) in zip(cache.layers, want):
            n = k.shape[0]
            np.testing.assert_array_equal(layer.k[:n], k)
            np.testing.assert_array_equal(layer.v[:n], v)
    _fill(a, 300, 40, seed=2)  # past the prefix (the last shared page too; a ring: over it)
    if not windows[1]:  # (a wrapped window cannot be cut back)
        assert a.truncate(100)
        _fill(a, 100, 150, seed=3)  # within it, after a cut back
    # (a did write over rows it shares: cut back, or its ring came round)
    assert any(not np.array_equal(mine.k[:k.shape[0]], k) for mine, (k, _) in zip(a.layers, want))
    for layer, (k, v) in zip(b.layers, want):
        n = k.shape[0]
        np.testing.assert_array_equal(layer.k[:n], k)  # the other cache
        np.testing.assert_array_equal(layer.v[:n], v)
    for (k, v), sk, sv in zip(want, snap.k, snap.v):  # the snapshot
        np.testing.assert_array_equal(sk, k)
        np.testing.assert_array_equal(sv, v)
        assert not sk.flags.writeable


@linux
def test_rows_that_do_not_line_up_with_pages_are_copied():
    src = np.arange(300 * 128, dtype=np.float32).reshape(300, 2, 64)
    rows = RowFile([src]).arrays[0]
    region = kv_cache.lazy_zeros((2, 1024, 2, 64), np.float32)
    assert map_rows(region[0][:300], rows)
    assert not map_rows(region[1][3:303], rows)  # 3 rows into a page: the file's is 0
    assert not map_rows(np.zeros((300, 2, 64), np.float32), rows)  # not a lazy mapping
    assert not map_rows(region[0][:300], src)  # not a snapshot's rows
    np.testing.assert_array_equal(region[0][:300], src)


@pytest.mark.skipif(sys.platform != "linux", reason="counts Linux's mappings")
def test_slots_restored_from_one_snapshot_answer_as_cold(converted, monkeypatch):
    """Three requests sharing a 100-token prefix on two slots with the shared prompt cache:
    the later ones restore it (mapped), write past it, and still answer as a full
    prefill does."""
    ids = [int(t) for t in reference("llama")["input_ids"]]
    prefix = (ids * 20)[:100]
    prompts = [prefix + ids[1:4], prefix + ids[4:9], prefix + ids[2:3]]
    maps = []

    def counted(dst, src):
        done = map_rows(dst, src)
        maps.append(done)
        return done

    monkeypatch.setattr(kv_cache, "map_rows", counted)
    with edgellm.load(converted("llama", "q4_1"), context=256, threads=2) as llm:
        cold = []
        for p in prompts:
            llm.model.reset()
            cold.append([c.token for c in llm.stream_ids(p, max_tokens=6, temperature=0)])
        batch = Batch(llm, 2, prompt_cache_bytes=64 << 20)
        try:
            got = [None] * 3
            slot = batch.slots

            def run(i, s):
                got[i] = [c.token for c in s.stream_ids(prompts[i], max_tokens=6,
                                                        temperature=0)]

            run(0, slot[0])
            pair = [threading.Thread(target=run, args=(i, slot[i - 1])) for i in (1, 2)]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            assert got == cold
            assert batch.prompt_cache.entries and (not AVAILABLE or any(maps))
        finally:
            batch.close()


def test_an_ended_requests_snapshot_is_copied_beside_the_engine(converted, monkeypatch):
    """The copy of a slot's sequence into the shared prompt cache, when its request ends,
    runs on the request's thread (the engine only files it): the engine's other slots do
    not wait for it."""
    from edgellm.cache import prompt_cache

    ids = [int(t) for t in reference("llama")["input_ids"]]
    threads = []

    def kept(cache):
        threads.append(threading.current_thread().name)
        return kept_state(cache)

    monkeypatch.setattr(prompt_cache, "kept_state", kept)
    with edgellm.load(converted("llama", "q4_1"), context=256, threads=2) as llm:
        batch = Batch(llm, 2, prompt_cache_bytes=64 << 20)
        try:
            list(batch.slots[0].stream_ids(ids[:40], max_tokens=3, temperature=0))
            batch.call(lambda: None)  # the filing, queued before this, has run
            assert threads and "edgellm-engine" not in threads, threads
            assert len(batch.prompt_cache.entries) == 1
        finally:
            batch.close()
