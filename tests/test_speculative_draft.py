"""Draft-model speculation (draft="small.edgellm"): greedy output is the target's token for
token; with temperature > 0 each guess drawn from the draft's q is accepted with
min(1, p/q) or replaced by a draw from the residual, so the output is distributed as the
target's own (a chi-square test on a tiny model's next-token distribution), and a seed
gives the same output again."""

import math

import numpy as np
import pytest
from conftest import reference
from speculative_models import smollm2

import edgellm
from edgellm.errors import ArgumentError
from edgellm.sampling import Sampler, SamplingParams
from edgellm.speculative.loop import _accept
from edgellm.speculative.tuner import Tuner


def _chi2_z(observed, expected):
    """The Wilson-Hilferty z of the chi-square statistic (expected counts >= 5, the rest
    pooled): about N(0, 1) where observed follows expected."""
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    k = obs.size - 1
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def test_accepted_tokens_follow_the_models_distribution(converted):
    ids = [int(t) for t in reference("llama")["input_ids"]][:8]
    with edgellm.load(converted("llama", "f32")) as target, \
            edgellm.load(converted("llama", "q4_0")) as draft:
        p_logits = target.logits(ids)[-1]
        q_logits = draft.logits(ids)[-1]
    params = SamplingParams(temperature=0.8, top_k=0, seed=0)
    p = Sampler(params, p_logits.size).distribution(p_logits)
    # a draft distribution well off the target's: the draft's logits at temperature 1.6
    q = Sampler(SamplingParams(temperature=1.6), q_logits.size).distribution(q_logits)
    assert 0.5 * np.abs(p - q).sum() > 0.1
    n = 20000
    counts = np.zeros(p.size)
    sampler = Sampler(params, p.size)
    draws = np.random.default_rng(1).choice(q.size, size=n, p=q)
    taken = 0
    for d in draws:
        token = _accept(p_logits.copy(), sampler, [], None, int(d), q)
        counts[token] += 1
        taken += token == d
    assert abs(_chi2_z(counts, n * p)) < 4.0
    assert abs(taken / n - np.minimum(p, q).sum()) < 0.02  # the acceptance theory gives


@pytest.fixture(autouse=True)
def _free_rows(monkeypatch):
    monkeypatch.setattr(Tuner, "cost", lambda self, n: 1.0)


def _tokens(llm, prompt, **kw):
    with llm.stream(prompt, **kw) as chunks:
        chunks = list(chunks)
    return [c.token for c in chunks], chunks[-1].stats


def test_greedy_is_the_targets_output(converted):
    ids = [int(t) for t in reference("llama")["input_ids"]]
    with edgellm.load(converted("llama", "q8_0"), draft=str(converted("llama", "q4_0"))) \
            as spec, edgellm.load(converted("llama", "q8_0")) as plain:
        guessed = 0
        for prompt in (ids[:6], ids[3:12], ids[:2]):
            a, stats = _tokens(spec, prompt, max_tokens=30, temperature=0)
            b, _ = _tokens(plain, prompt, max_tokens=30, temperature=0)
            assert a == b
            guessed += stats.accepted_tokens
        assert guessed > 0


def test_the_draft_reads_the_prompt_before_the_first_token(converted):
    """The draft's prefill is the prompt's cost, not the decode's (it was run at the first
    guess, after the first token)."""
    ids = [int(t) for t in reference("llama")["input_ids"]][:12]
    with edgellm.load(converted("llama", "q8_0"), draft=str(converted("llama", "q4_0"))) \
            as spec:
        draft = spec.speculation.draft.model
        with spec.stream(ids, max_tokens=6, temperature=0) as chunks:
            next(iter(chunks))
            assert draft.tokens == ids
        a, _ = _tokens(spec, ids, max_tokens=6, temperature=0)
    with edgellm.load(converted("llama", "q8_0")) as plain:
        assert a == _tokens(plain, ids, max_tokens=6, temperature=0)[0]


def test_sampling_is_reproducible_by_seed(converted, monkeypatch):
    """The same seed, the same output, whatever the step timings were."""
    monkeypatch.undo()  # the tuner's own costs
    ids = [int(t) for t in reference("llama")["input_ids"]][:6]
    with edgellm.load(converted("llama", "q8_0"), draft=str(converted("llama", "q4_0"))) \
            as spec:
        a, stats = _tokens(spec, ids, max_tokens=30, temperature=0.8, seed=5)
        assert stats.proposed_tokens > 0
        tuner = spec.speculation.tuner
        tuner.secs = {n: 0.01 * n * n for n in range(1, 9)}  # timings that would stop it
        b, stats = _tokens(spec, ids, max_tokens=30, temperature=0.8, seed=5)
        assert a == b and stats.proposed_tokens > 0
        d, _ = _tokens(spec, ids, max_tokens=30, temperature=0.8, seed=6)
        assert d != a


def test_a_draft_with_another_tokenizer_is_refused(converted):
    with pytest.raises(ArgumentError, match="tokenizer"):
        edgellm.load(converted("llama", "q8_0"), draft=str(smollm2()))
