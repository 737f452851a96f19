"""A server slot's unconstrained generation sampled by the engine (batch.SlotModel.run_ahead):
the same tokens as the model's own generation, at most one token ahead of the caller, and
the rows run past the caller's last token taken off the cache when it stops early."""

import threading
import time

import pytest

import edgellm
from edgellm.batch import Batch


@pytest.fixture(scope="module")
def llm(smollm2):
    with edgellm.load(smollm2, context=512) as model:
        yield model


@pytest.fixture
def batch(llm):
    b = Batch(llm, 2)
    yield b
    b.close()


@pytest.fixture(scope="module")
def alone(llm):
    """Token ids of the model's own generations (before any Batch shares its weights)."""
    return {k: _tokens(llm, max_tokens=24, **kw) for k, kw in SAMPLING.items()}


PROMPT = [{"role": "user", "content": "Write a short poem about the sea."}]
SAMPLING = {"greedy": dict(temperature=0),
            "sampled": dict(temperature=0.9, top_p=0.9, seed=7, repetition_penalty=1.3)}


def _tokens(slot, **kwargs):
    with slot.stream(PROMPT, **kwargs) as chunks:
        return [c.token for c in chunks if c.token is not None]


@pytest.mark.parametrize("kind", list(SAMPLING))
def test_a_slot_generates_what_the_model_alone_does(alone, batch, kind):
    """The engine draws the slot's tokens with the request's own sampler (its seed, its
    penalties over the history): the same ids as the model's generation alone; a second
    slot generating at the same time changes nothing. The second starts once the first's
    prompt is in: prompts prefilled in one pass are within rounding of their prefill alone
    (batch.py), which a sampled draw near a boundary can follow either way (one CI run in
    several); decode rows beside another slot's are the single step's bit for bit."""
    other = threading.Thread(target=_tokens, args=(batch.slots[1],),
                             kwargs=dict(max_tokens=40, temperature=0))
    got = []
    with batch.slots[0].stream(PROMPT, max_tokens=24, **SAMPLING[kind]) as chunks:
        for c in chunks:
            got += [c.token] if c.token is not None else []
            if not other.is_alive() and other.ident is None:
                other.start()
    other.join(60)
    assert got == alone[kind] and len(got) == 24
    assert batch.rows > batch.rounds  # the two slots shared steps


def test_the_cache_holds_what_was_run_and_no_more(llm, batch):
    """Ended by max_tokens: the last token is never run (as generate_step's contract); the
    slot's tokens are its cache's, prompt and answer but the last."""
    slot = batch.slots[0]
    ids = slot.encode_prompt(PROMPT)
    got = _tokens(slot, max_tokens=10, temperature=0)
    model = slot.model
    assert model.tokens == ids + got[:-1]
    assert model.cache.n_tokens == len(model.tokens)


def test_no_row_runs_for_the_last_token_or_an_end_of_sequence(llm, batch):
    """The engine does not queue the row of a token the caller stops at (the end of
    sequence, the max_tokens-th): a generation of n tokens runs n - 1 decode rows when
    max_tokens ends it, n when the end of sequence does (the one it sampled last)."""
    for slot, ask, reason in ((batch.slots[0], dict(max_tokens=12), "length"),
                              (batch.slots[1], dict(max_tokens=200), "stop")):
        rows = batch.rows  # (a fresh slot: its prompt is prefilled, no row of it alone)
        messages = [{"role": "user", "content": "What colour is the sky? One word."}]
        with slot.stream(messages, temperature=0, **ask) as chunks:
            chunks = list(chunks)
        got = [c.token for c in chunks if c.token is not None]
        assert chunks[-1].finish_reason == reason
        assert batch.rows - rows == len(got) - (reason == "length")


def test_a_slow_caller_is_at_most_one_token_behind(llm, batch):
    """While the caller holds its first token, the engine runs that token's row and the
    next one's, then waits; when the caller stops, both rows come off the cache."""
    slot = batch.slots[0]
    ids = slot.encode_prompt(PROMPT)
    with slot.stream(PROMPT, max_tokens=50, temperature=0) as chunks:
        first = next(iter(chunks))
        time.sleep(0.5)  # the engine would have run ~100 more steps by now
        assert len(slot.model.tokens) == len(ids) + 2
    assert first.token is not None
    assert slot.model.tokens == ids
    assert slot.model.cache.n_tokens == len(ids)


def test_a_stop_string_takes_the_rows_past_it_off(llm, batch):
    """A stop string ends the stream after the engine may have run a row or two more: the
    cache keeps the prompt and the tokens before the last one the caller took."""
    slot = batch.slots[0]
    ids = slot.encode_prompt(PROMPT)
    full = _tokens(slot, max_tokens=30, temperature=0)
    text = slot.tokenizer.decode(full)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    with slot.stream(PROMPT, max_tokens=30, temperature=0, stop=[stop]) as chunks:
        got = [c.token for c in chunks if c.token is not None]
    assert got == full[:len(got)] and len(got) < len(full)
    assert slot.model.tokens == ids + got[:-1]
    assert slot.model.cache.n_tokens == len(slot.model.tokens)
    again = _tokens(slot, max_tokens=30, temperature=0)  # the prompt's prefix reused
    assert again == full


def test_a_full_context_without_shift_ends_as_alone(smollm2, monkeypatch):
    """shift=False: the stream ends where the context is full ("length"), after as many
    tokens as the model alone gives (the row that fills the context is not run ahead:
    generate.stream reads the room left after each token). The request thread is slowed
    (its detokenizer), so the engine's rows run before it reads the room."""
    from edgellm import generate
    messages = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    ask = dict(max_tokens=200, temperature=0, shift=False)
    with edgellm.load(smollm2, context=64) as small:
        with small.stream(messages, **ask) as chunks:
            alone = [c.token for c in chunks if c.token is not None]
        add = generate.StreamingDetokenizer.add

        def slow_add(self, token):
            time.sleep(0.01)
            return add(self, token)

        monkeypatch.setattr(generate.StreamingDetokenizer, "add", slow_add)
        b = Batch(small, 2)
        try:
            slot = b.slots[0]
            with slot.stream(messages, **ask) as chunks:
                chunks = list(chunks)
            got = [c.token for c in chunks if c.token is not None]
            assert got == alone and chunks[-1].finish_reason == "length"
            assert slot.model.cache.n_tokens == len(slot.model.tokens) == 64
        finally:
            b.close()
