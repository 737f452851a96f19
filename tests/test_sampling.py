"""Sampler: filters keep to their sets, draws follow the distribution, penalties are exact."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgellm.errors import SamplingError
from edgellm.sampling import Sampler, SamplingParams

SETTINGS = settings(max_examples=60, deadline=None)
# vocab sizes: tiny, not a multiple of the 1024 draw block, and large enough (> 16384) for
# the sampled top-k threshold
VOCABS = st.sampled_from([7, 50, 3000, 20000, 49152])


def _logits(seed: int, vocab: int, scale: float, spikes: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(vocab).astype(np.float32) * scale
    ids = rng.choice(vocab, min(spikes, vocab), replace=False)
    x[ids] += rng.uniform(2, 12, ids.size).astype(np.float32)
    return x


logit_cases = st.builds(_logits, st.integers(0, 2**32 - 1), VOCABS,
                        st.sampled_from([0.1, 0.5, 2.0, 5.0]), st.integers(0, 30))


def _probs(x: np.ndarray, temperature: float) -> np.ndarray:
    z = (x.astype(np.float64) - x.max()) / temperature
    p = np.exp(z)
    return p / p.sum()


def _allowed(x, temperature, top_k=0, top_p=1.0, min_p=0.0, tol=1e-4) -> np.ndarray:
    """Ids each filter may keep (ties at a boundary allowed), intersected. [V] bool."""
    ok = np.ones(x.size, bool)
    if 0 < top_k < x.size:
        ok &= x >= np.sort(x)[-top_k]
    if top_p < 1:
        p = np.where(ok, _probs(x, temperature), 0.0)
        p /= p.sum()
        order = np.argsort(-x, kind="stable")
        above = np.cumsum(p[order]) - p[order]  # mass of tokens before each in order
        # mass strictly more likely than token i (ties share the smallest "before" mass)
        first = np.searchsorted(-x[order], -x[order], side="left")
        mass_above = np.empty(x.size)
        mass_above[order] = above[first]
        ok &= mass_above < top_p + tol
    if min_p > 0:
        ok &= x >= x.max() + temperature * math.log(min_p) - tol
    return ok


def _draws(sampler: Sampler, x: np.ndarray, n: int) -> np.ndarray:
    return np.array([sampler.sample(x) for _ in range(n)])


# ---------------------------------------------------------------- filters


@SETTINGS
@given(x=logit_cases, k=st.integers(1, 60), t=st.sampled_from([0.3, 1.0, 2.0]),
       seed=st.integers(0, 1000))
def test_top_k_stays_in_set(x, k, t, seed):
    s = Sampler(SamplingParams(temperature=t, top_k=k, seed=seed), x.size)
    assert _allowed(x, t, top_k=k)[_draws(s, x, 30)].all()


@SETTINGS
@given(x=logit_cases, top_p=st.sampled_from([0.05, 0.3, 0.5, 0.9, 0.99]),
       t=st.sampled_from([0.3, 1.0, 2.0]), seed=st.integers(0, 1000))
def test_top_p_stays_in_set(x, top_p, t, seed):
    s = Sampler(SamplingParams(temperature=t, top_p=top_p, seed=seed), x.size)
    assert _allowed(x, t, top_p=top_p)[_draws(s, x, 30)].all()


@SETTINGS
@given(x=logit_cases, min_p=st.sampled_from([0.001, 0.05, 0.3, 0.9, 1.0]),
       t=st.sampled_from([0.3, 1.0, 2.0]), seed=st.integers(0, 1000))
def test_min_p_stays_in_set(x, min_p, t, seed):
    s = Sampler(SamplingParams(temperature=t, min_p=min_p, seed=seed), x.size)
    assert _allowed(x, t, min_p=min_p)[_draws(s, x, 30)].all()


@SETTINGS
@given(x=logit_cases, k=st.integers(0, 100), top_p=st.sampled_from([0.2, 0.8, 1.0]),
       min_p=st.sampled_from([0.0, 0.05, 0.5]), seed=st.integers(0, 1000))
def test_filters_combined_stay_in_set(x, k, top_p, min_p, seed):
    s = Sampler(SamplingParams(temperature=0.8, top_k=k, top_p=top_p, min_p=min_p, seed=seed),
                x.size)
    assert _allowed(x, 0.8, top_k=k, top_p=top_p, min_p=min_p)[_draws(s, x, 30)].all()


def test_large_min_p_set_with_little_mass():
    # min-p keeps > 4096 ids holding ~2% of the mass: rejection gives up, masking takes over
    x = np.full(262144, math.log(0.0499), np.float32)
    x[:4500] = math.log(0.0501)
    x[0] = 0.0
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.05, seed=1), x.size)
    draws = _draws(s, x, 200)
    assert (draws < 4500).all()
    assert len(set(draws.tolist())) > 100  # spread over the kept set, not stuck on the max


# ---------------------------------------------------------------- distribution


def _check_frequencies(sampler, x, expected, n=20000):
    counts = np.bincount(_draws(sampler, x, n), minlength=x.size) / n
    assert counts[expected == 0].sum() == 0
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(counts - expected) <= 5 * sigma + 1e-3)


@pytest.mark.parametrize("vocab", [10, 1500])
def test_plain_temperature_follows_softmax(vocab):
    x = _logits(3, vocab, 1.0, 5)
    x[5:] -= 6  # a few likely ids, and a long tail that still gets drawn
    s = Sampler(SamplingParams(temperature=0.7, seed=0), vocab)
    _check_frequencies(s, x, _probs(x, 0.7))


@pytest.mark.parametrize("top_p", [0.3, 0.75, 0.95])
def test_top_p_follows_renormalized_nucleus(top_p):
    x = _logits(5, 1500, 1.5, 8)
    p = _probs(x, 1.0)
    expected = np.where(_allowed(x, 1.0, top_p=top_p, tol=0), p, 0.0)
    s = Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=2), x.size)
    _check_frequencies(s, x, expected / expected.sum())


def test_top_k_and_min_p_follow_renormalized_sets():
    x = _logits(9, 300, 1.0, 12)
    for params, kept in [(dict(top_k=7), _allowed(x, 1.0, top_k=7)),
                         (dict(min_p=0.02), _allowed(x, 1.0, min_p=0.02, tol=0))]:
        expected = np.where(kept, _probs(x, 1.0), 0.0)
        s = Sampler(SamplingParams(temperature=1.0, seed=4, **params), x.size)
        _check_frequencies(s, x, expected / expected.sum())


# ---------------------------------------------------------------- greedy and seeds


@SETTINGS
@given(x=logit_cases)
def test_greedy_is_argmax(x):
    s = Sampler(SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.1), x.size)
    assert s.sample(x) == int(np.argmax(x))


@SETTINGS
@given(x=logit_cases, seed=st.integers(0, 2**32), top_p=st.sampled_from([0.5, 1.0]),
       k=st.sampled_from([0, 20]))
def test_same_seed_same_tokens(x, seed, top_p, k):
    params = SamplingParams(temperature=1.3, top_k=k, top_p=top_p, seed=seed,
                            presence_penalty=0.3)
    a, b = Sampler(params, x.size), Sampler(params, x.size)
    history = [1, 2, 3]
    assert [a.sample(x, history) for _ in range(20)] == [b.sample(x, history) for _ in range(20)]


def test_different_seeds_differ():
    x = np.zeros(1000, np.float32)
    runs = {tuple(_draws(Sampler(SamplingParams(seed=seed), 1000), x, 10)) for seed in range(5)}
    assert len(runs) == 5


# ---------------------------------------------------------------- processors


@SETTINGS
@given(seed=st.integers(0, 2**32), r=st.sampled_from([0.5, 1.3, 2.0]),
       ctx=st.sampled_from([None, 1, 5, 64]), n_hist=st.integers(0, 40))
def test_repetition_penalty_exact(seed, r, ctx, n_hist):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(200).astype(np.float32) * 3
    history = rng.integers(0, 200, n_hist).tolist()
    s = Sampler(SamplingParams(repetition_penalty=r, repetition_context=ctx), 200)
    out = s.process(x, history).copy()
    window = set(history if ctx is None else history[-ctx:])
    for i in range(200):
        want = (x[i] / r if x[i] > 0 else x[i] * r) if i in window else x[i]
        assert out[i] == np.float32(want)


def test_presence_and_frequency_count_generated_tokens_only():
    vocab = 50
    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25),
                vocab)
    x = np.zeros(vocab, np.float32)
    generated = []
    for token in [3, 3, 7, 3, 9]:  # force each token by making it the argmax
        forced = x.copy()
        forced[token] = 100.0
        generated.append(s.sample(forced, history=[1, 2]))  # the prompt is not counted
    assert generated == [3, 3, 7, 3, 9]
    out = s.process(x, history=[1, 2])
    expected = np.zeros(vocab, np.float32)
    expected[3] = -(0.25 * 3 + 0.5)
    expected[7] = expected[9] = -(0.25 + 0.5)
    np.testing.assert_array_equal(out, expected)
    s.reset()
    assert s.process(x) is x  # nothing counted any more: no copy, no change


def test_logit_bias_exact_and_input_untouched():
    x = np.arange(10, dtype=np.float32)
    original = x.copy()
    s = Sampler(SamplingParams(temperature=0.0, logit_bias={0: 100.0, 9: -5.5}), 10)
    out = s.process(x)
    np.testing.assert_array_equal(out, original + np.array([100, 0, 0, 0, 0, 0, 0, 0, 0, -5.5],
                                                          np.float32))
    np.testing.assert_array_equal(x, original)
    assert s.sample(x) == 0


def test_no_processor_means_no_copy():
    x = np.ones(10, np.float32)
    assert Sampler(SamplingParams(repetition_penalty=1.5), 10).process(x) is x  # no history


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(repetition_context=0), "repetition_context"),
    (dict(presence_penalty=float("inf")), "presence_penalty"),
    (dict(frequency_penalty="1"), "frequency_penalty"),
    (dict(logit_bias={1: float("nan")}), "logit_bias"),
    (dict(logit_bias={"a": 1.0}), "logit_bias"),
    (dict(logit_bias=[(1, 2.0)]), "logit_bias"),
    (dict(seed=-1), "seed"),
])
def test_params_validation(kwargs, name):
    with pytest.raises(SamplingError, match=name) as info:
        SamplingParams(**kwargs)
    assert "\n" not in str(info.value)


def test_logit_bias_ids_checked_against_vocab():
    with pytest.raises(SamplingError, match="logit_bias id 10"):
        Sampler(SamplingParams(logit_bias={10: 1.0}), 10)
    with pytest.raises(SamplingError, match="logit_bias id -1"):
        Sampler(SamplingParams(logit_bias={-1: 1.0}), 10)


def test_bad_logits():
    s = Sampler(SamplingParams(), 10)
    with pytest.raises(SamplingError, match="shape"):
        s.sample(np.zeros(11, np.float32))
    bad = np.zeros(10, np.float32)
    bad[3] = np.nan
    with pytest.raises(SamplingError, match="NaN"):
        s.sample(bad)
    with pytest.raises(SamplingError, match="NaN"):
        Sampler(SamplingParams(temperature=0), 10).sample(bad)


def test_from_generation_config():
    greedy = SamplingParams.from_generation_config({"temperature": 0.6, "top_p": 0.9})
    assert greedy.temperature == 0.0
    p = SamplingParams.from_generation_config(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": None,
         "repetition_penalty": 1.1}, seed=3)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.seed) == \
        (0.6, 50, 0.9, 0.0, 1.1, 3)


@pytest.mark.parametrize("kwargs, words", [
    ({"logit_bias": {5: 1e39}}, "logit_bias[5] must be within"),
    ({"repetition_penalty": 1e-40}, "repetition_penalty must be in"),
    ({"presence_penalty": 1e35}, "presence_penalty must be within"),
    ({"frequency_penalty": -1e35}, "frequency_penalty must be within"),
])
def test_values_that_would_overflow_the_logits_are_refused(kwargs, words):
    """Finite, but past what float32 logits take: they would become +inf in the sampler,
    whose non-finite check blames the model's weights; refused up front instead."""
    with pytest.raises(SamplingError) as e:
        SamplingParams(**kwargs)
    assert words in str(e.value)
    SamplingParams(logit_bias={5: -math.inf, 6: 1e30}, repetition_penalty=1e-6,
                   presence_penalty=1e6)  # a ban, and the bounds themselves, stay allowed


def test_numpy_scalars_are_numbers():
    """np.float32(0.5), np.int64(3): what a numpy pipeline hands over; taken as the Python
    numbers they are (np.bool_ is still not a number)."""
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(5), seed=np.int32(3),
                       top_p=np.float64(0.9))
    assert (p.temperature, p.top_k, p.seed, p.top_p) == (0.5, 5, 3, 0.9)
    assert type(p.top_k) is int and type(p.temperature) is float
    with pytest.raises(SamplingError):
        SamplingParams(temperature=np.True_)

