"""Transformer.forward_rows: several sequences' next tokens through the layers as one chunk
of rows, each over its own cache at its own positions (the server's batching runs on it)."""

import numpy as np
from conftest import reference

import edgellm


def _holding(m, ids):
    """A new cache holding `ids` (the per-operation prefill)."""
    saved = m.cache, m.tokens
    m.cache, m.tokens = m.new_cache(), []
    try:
        m.forward(ids, want="none")
        return m.cache
    finally:
        m.cache, m.tokens = saved


def test_rows_of_several_caches_are_each_sequences_forward(converted):
    """One part is forward's own chunk, bit for bit; parts of two caches each advance their
    cache by their own tokens and give the logits of each sequence alone, within the prefill
    tiles' rounding (the rows' count groups them), and the same greedy token."""
    ids = [int(t) for t in reference("gemma3")["input_ids"]]
    with edgellm.load(converted("gemma3", "q4_0"), threads=2) as llm:
        m = llm.model
        prefixes, parts = [ids[:2], ids[3:7]], [ids[2:9], ids[:3]]
        alone = []
        for prefix, part in zip(prefixes, parts):
            m.cache, m.tokens = _holding(m, prefix), list(prefix)
            alone.append(m.forward(part, want="last").copy())
        cache = _holding(m, prefixes[0])
        x = m.forward_rows([np.array(parts[0], np.int64)], [cache])
        assert np.array_equal(m.head_logits(x[-1:])[0], alone[0])
        assert (cache.next_pos, cache.n_tokens) == (9, 9)
        caches = [_holding(m, p) for p in prefixes]
        x = m.forward_rows([np.array(p, np.int64) for p in parts], caches)
        assert x.shape == (len(parts[0]) + len(parts[1]), m.args.hidden_size)
        assert [(c.next_pos, c.n_tokens) for c in caches] == [(9, 9), (7, 7)]
        for end, want in zip((7, 10), alone):
            got = m.head_logits(x[end - 1:end])[0]
            assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
            assert int(got.argmax()) == int(want.argmax())
