"""A hypothesis sweep over the public API's keywords: wrong types, extreme numbers and bad
strings end in an EdgeLLMError subclass or in success, never in another exception.

SWEEP is a table: function -> (call, strategy per keyword, examples). Adding a method to
the sweep is one entry. About 1,000 examples in all, on one tiny model loaded once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edgellm
from edgellm.errors import EdgeLLMError

VOCAB = 512  # the tiny llama fixture's

# -------------------------------------------------------------------------- strategies

BAD = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([2**63, -2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.binary(max_size=6), st.lists(st.integers(-3, 600), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-2, 2), max_size=2),
    st.builds(object), st.just(np.float32(1.5)), st.just(np.int64(3)), st.just(np.array([1, 2])),
)


def kw(valid: st.SearchStrategy, bad: st.SearchStrategy = BAD) -> st.SearchStrategy:
    """A keyword's values: valid ones (extremes included) 5 times in 6, else anything, so
    that examples with several keywords still reach the model often."""
    return st.integers(0, 5).flatmap(lambda i: bad if i == 0 else valid)


TEXT = st.text(max_size=12)
SURROGATE = st.builds(lambda a, b: a + "\udcff" + b, TEXT, TEXT)  # undecodable bytes
IDS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)
BAD_IDS = st.lists(st.one_of(st.integers(0, VOCAB - 1), st.integers(-2**64, 2**64),
                             st.floats(), st.booleans()), min_size=0, max_size=4)
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": TEXT}),
    min_size=1, max_size=3)
BAD_MESSAGES = st.lists(st.fixed_dictionaries({"role": BAD, "content": st.one_of(
    BAD, SURROGATE)}), min_size=1, max_size=2)
PROMPT = kw(st.one_of(TEXT, IDS, MESSAGES, st.tuples(st.integers(0, VOCAB - 1)),
                      st.builds(lambda v: np.array(v, dtype=np.int64), IDS)),
            st.one_of(BAD, SURROGATE, BAD_IDS, BAD_MESSAGES, st.just([]),
                      st.builds(lambda v: np.array(v), st.lists(st.floats(), max_size=3))))
SMALL_INT = st.integers(0, 3)
UNIT = st.floats(0, 1)
SAMPLING = {
    # small when valid: a huge one is valid too, and runs until the end of sequence
    "max_tokens": kw(SMALL_INT, BAD.filter(lambda v: not (type(v) is int and v > 3))),
    "stop": kw(st.one_of(TEXT, st.lists(TEXT, max_size=3), st.tuples(TEXT)),
               st.one_of(BAD, SURROGATE)),
    "shift": kw(st.booleans()),
    "temperature": kw(st.floats(0, 1e30)),
    "top_k": kw(st.integers(0, 2**63)),
    "top_p": kw(UNIT),
    "min_p": kw(UNIT),
    "repetition_penalty": kw(st.floats(1e-30, 1e30)),
    "repetition_context": kw(st.integers(1, 2**63)),
    "presence_penalty": kw(st.floats(-1e30, 1e30)),
    "frequency_penalty": kw(st.floats(-1e30, 1e30)),
    "logit_bias": kw(st.dictionaries(st.one_of(st.integers(-5, VOCAB + 5), TEXT, st.floats()),
                                     st.one_of(st.floats(), st.integers(-2**70, 2**70),
                                               st.none()), max_size=3)),
    "seed": kw(st.integers(-2**70, 2**70)),
    "blocking": kw(st.booleans()),
    "timeout": kw(st.one_of(st.none(), st.floats(0, 1))),
}
WAIT = {k: SAMPLING[k] for k in ("blocking", "timeout")}


# --------------------------------------------------------------------------- the table

@dataclass
class Entry:
    call: Callable[..., Any]
    required: dict[str, st.SearchStrategy]
    optional: dict[str, st.SearchStrategy] = field(default_factory=dict)
    examples: int = 100
    model: str = "decoder"  # which of the module's models it runs on: "decoder", "encoder"


def _load(llm, **kwargs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", edgellm.errors.ContextWarning)  # a word, not an error
        edgellm.load(**kwargs).close()


def _stream(llm, **kwargs):
    for _ in llm.stream(**kwargs):
        pass


def _chat(llm, message, system=None, **kwargs):
    llm.chat(system=system).ask(message, **kwargs)


def _chat_completion(llm, **kwargs):
    out = llm.create_chat_completion(**kwargs)
    if kwargs.get("stream") is True:
        for _ in out:
            pass


TOOLS = [{"type": "function", "function": {
    "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
CHAT_COMPLETION = {
    "tools": kw(st.one_of(st.none(), st.just(TOOLS), st.just([]))),
    "tool_choice": kw(st.one_of(st.none(), st.sampled_from(["auto", "none", "required"]),
                                st.just({"type": "function", "function": {"name": "f"}}))),
    "response_format": kw(st.one_of(st.none(), st.just({"type": "json_object"}),
                                    st.just({"type": "text"}))),
    "stream": kw(st.booleans()),
    "enable_thinking": kw(st.one_of(st.none(), st.booleans())),
    "max_reasoning_tokens": kw(st.one_of(st.none(), SMALL_INT)),
    "parallel_tool_calls": kw(st.booleans()),
    "chat_template_kwargs": kw(st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=2))),
}


def sweep_table(path: str) -> dict[str, Entry]:
    return {
        "load": Entry(_load, {"path": kw(st.just(path))},
                      {"threads": kw(st.integers(1, 2)), "context": kw(st.integers(0, 300)),
                       "precise": kw(st.booleans()), "fused": kw(st.booleans()),
                       "kv_type": kw(st.sampled_from(["f32", "f16", "q8_0"]), st.one_of(BAD, TEXT)),
                       "prompt_cache_bytes": kw(st.integers(0, 2**63))}, examples=80),
        "generate": Entry(lambda llm, **k: llm.generate(**k), {"prompt": PROMPT,
                                                              "max_tokens": SAMPLING["max_tokens"]},
                          SAMPLING, examples=300),
        "stream": Entry(_stream, {"prompt": PROMPT, "max_tokens": SAMPLING["max_tokens"]},
                        SAMPLING, examples=200),
        "logits": Entry(lambda llm, **k: llm.logits(**k),
                        {"token_ids": st.one_of(kw(IDS, BAD_IDS), PROMPT)}, WAIT,
                        examples=170),
        "chat": Entry(_chat, {"message": kw(TEXT, st.one_of(BAD, SURROGATE)),
                              "max_tokens": SAMPLING["max_tokens"]},
                      {"system": kw(TEXT, st.one_of(BAD, SURROGATE)), **SAMPLING},
                      examples=100),
        "apply_chat_template": Entry(lambda llm, **k: llm.apply_chat_template(**k),
                                     {"messages": kw(MESSAGES, st.one_of(BAD, BAD_MESSAGES))},
                                     {"add_generation_prompt": kw(st.booleans())},
                                     examples=150),
        "create_chat_completion": Entry(
            _chat_completion, {"messages": kw(MESSAGES, st.one_of(BAD, BAD_MESSAGES)),
                               "max_tokens": SAMPLING["max_tokens"]},
            {**SAMPLING, **CHAT_COMPLETION}, examples=120),
        "embed": Entry(lambda llm, **k: llm.embed(**k),
                       {"texts": kw(st.one_of(TEXT, st.lists(TEXT, max_size=4), st.tuples(TEXT)),
                                    st.one_of(BAD, SURROGATE, st.lists(BAD, max_size=2)))},
                       {"normalize": kw(st.one_of(st.none(), st.booleans())),
                        "batch_size": kw(st.integers(1, 2**63))},
                       examples=100, model="encoder"),
    }


@pytest.fixture(scope="module")
def model_path(converted):
    return str(converted("llama", "q8_0"))


@pytest.fixture(scope="module")
def models(model_path, tmp_path_factory):
    """The decoder and a tiny BERT encoder, each loaded once for the module."""
    from converter.hf_source import open_hf
    from converter.pack import convert

    from conftest import FIXTURES

    encoder = tmp_path_factory.mktemp("sweep") / "bert-tiny.edgellm"
    convert(open_hf(FIXTURES / "embed" / "bert-tiny"), encoder, "f32", progress=False)
    with edgellm.load(model_path) as decoder, edgellm.load(encoder) as enc:
        yield {"decoder": decoder, "encoder": enc}


@pytest.mark.parametrize("name", list(sweep_table("")))
def test_api_sweep(name, models, model_path):
    entry = sweep_table(model_path)[name]
    llm = models[entry.model]
    optional = {k: v for k, v in entry.optional.items() if k not in entry.required}

    @settings(max_examples=entry.examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.fixed_dictionaries(entry.required, optional=optional))
    def check(kwargs):
        try:
            entry.call(llm, **kwargs)
        except EdgeLLMError as e:
            assert "\n" not in str(e), e

    check()
    if entry.model == "decoder":  # no turn left held
        assert llm.generate("still usable", max_tokens=2) is not None
    else:
        assert llm.embed("still usable").shape == (llm.args.hidden_size,)


def test_the_sweep_covers_about_1000_examples():
    assert sum(e.examples for e in sweep_table("").values()) >= 1000


# Values that a keyword's strategy reaches only sometimes, whichever hypothesis version
# draws the examples (a numpy array as tool_choice once ended in numpy's ValueError).
AWKWARD = [True, -1, float("nan"), float("inf"), b"ab", [1, 2], {"a": 1}, object(),
           np.float32(1.5), np.int64(3), np.array([1, 2]), np.array([]), (1,)]
VALID = {"generate": {"prompt": "hi", "max_tokens": 1},
         "create_chat_completion": {"messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 1},
         "embed": {"texts": "hi"}}


@pytest.mark.parametrize("name", list(VALID))
def test_every_keyword_takes_each_awkward_value(name, models, model_path):
    entry = sweep_table(model_path)[name]
    llm = models[entry.model]
    for key in {**entry.required, **entry.optional}:
        for value in AWKWARD:
            try:
                entry.call(llm, **{**VALID[name], key: value})
            except EdgeLLMError as e:
                assert "\n" not in str(e), (key, value, e)
