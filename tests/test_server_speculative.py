"""`edgellm serve --draft lookup`: each slot guesses by prompt lookup and its guesses are
verified in the batched step beside the other slots' rows; the answers are the server's
without --draft, token for token, with requests concurrent on 4 slots (greedy, sampled
with a seed, stop strings, logit_bias, penalties, a JSON schema), streamed a token a chunk."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from server_helpers import ThreadServer  # noqa: E402
from speculative_models import smollm2  # noqa: E402

import edgellm  # noqa: E402

RECORD = ("Name: Ada Lovelace\nBorn: 10 December 1815, London\nDied: 27 November 1852, "
          "Marylebone\nKnown for: the first published algorithm, for Babbage's Analytical "
          "Engine\nFather: Lord Byron\nMother: Anne Isabella Milbanke\n")
INVOICE = ("Invoice 4471 from Northwind Traders, 12 Harbour Road, Leith, to Contoso Ltd, "
           "dated 3 March 2024. Items: 12 steel brackets at 4.50 each; 3 boxes of bolts at "
           "11.20 each; delivery 15.00. Total due 102.60 by 2 April 2024.")
CODE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "born": {"type": "string"}},
          "required": ["name", "born"]}
# (messages, extra request fields): extraction-style prompts, where lookup guesses a lot,
# beside open-ended ones and every per-token rule the sampler applies
REQUESTS = [
    (user(RECORD + "\nAnswer in JSON with the keys name, born, died and known_for, copying "
          "the values."), {}),
    (user(INVOICE + "\nList the invoice number, seller, buyer, items and total, one per "
          "line, copied from the text."), {}),
    (user("Rename area to rect_area and give back all the code:\n" + CODE), {}),
    (user("Tell me about the sea."), {}),
    (user(RECORD + "\nCopy the text above exactly."), {"stop": ["Father"]}),
    (user(INVOICE + "\nWho sent the invoice and what is due?"),
     {"logit_bias": {"28": -5.0, "30": 2.0}}),
    (user("Rename perimeter to rect_perimeter:\n" + CODE),
     {"frequency_penalty": 0.3, "presence_penalty": 0.4}),
    (user(RECORD + "\nGive the name and birth of this person as JSON."),
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "p", "schema": SCHEMA}}}),
    (user(INVOICE + "\nSummarize it, quoting the total."),
     {"temperature": 0.8, "seed": 5}),
]
MAX_TOKENS = 64


def _ask(server, messages, extra, stream: bool):
    client = server.client().with_options(timeout=600)
    kw = {"model": "smollm2", "messages": messages, "max_tokens": MAX_TOKENS,
          "stream": stream, "temperature": 0, **extra}
    r = client.chat.completions.create(**kw)
    if not stream:
        c = r.choices[0]
        return c.message.content, c.finish_reason, r.usage.completion_tokens
    pieces, finish = [], None
    for chunk in r:
        if chunk.choices:
            d = chunk.choices[0]
            if d.delta.content:
                pieces.append(d.delta.content)
            finish = d.finish_reason or finish
    return pieces, finish


def _answers(llm, stream: bool = False):
    """Every request of REQUESTS at once on a 4-slot server of `llm` (the queue holds the
    rest), and the batch's slots (their last generations' guess counts). Each prompt is
    first prefilled alone (a 1-token request) into the shared prompt cache, from which the
    requests at once restore it: prompts prefilled together round as their grouping
    falls (batch.py), which would make two servers' answers differ where a sampled draw
    or a near-tie meets that rounding, guesses or not."""
    server = ThreadServer(llm, parallel=4)
    try:
        for m, x in REQUESTS:
            _ask(server, m, {**x, "max_tokens": 1}, False)
        time.sleep(0.5)  # the last prompt's snapshot kept (queued for the engine)
        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            futures = [pool.submit(_ask, server, m, x, stream) for m, x in REQUESTS]
            got = [f.result() for f in futures]
        batch = server.app.state.batch
        # every slot's token list is what its cache holds (the rows run past a stop or a
        # rejected guess taken back); the widest step's rows
        assert all(len(s.model.tokens) == s.model.cache.n_tokens for s in batch.slots)
        batch.widest = max(batch.costs.count) if hasattr(batch, "costs") else 0
        return got, batch.slots, batch
    finally:
        server.stop()


@pytest.fixture(scope="module")
def models():
    with edgellm.load(smollm2(), context=1024) as plain, \
            edgellm.load(smollm2(), context=1024, draft="lookup") as spec:
        yield plain, spec


def test_answers_are_the_plain_servers_token_for_token(models):
    plain, spec = models
    want, _, _ = _answers(plain)
    got, slots, batch = _answers(spec)
    assert got == want
    assert all(s.speculation is not None for s in slots)
    assert sum(s.speculation.proposed for s in slots) > 0  # it did guess
    assert sum(s.speculation.accepted for s in slots) > 0
    # the engine guessed for the unconstrained requests and sized the steps' rows itself
    assert batch.widest > 4


def test_engine_guesses_without_the_request_thread(models):
    """An unconstrained request's guesses are made, verified and sampled on the engine
    (SlotModel._speculate): no verify step waits for its request thread."""
    _, spec = models
    server = ThreadServer(spec, parallel=4)
    try:
        slots = server.app.state.batch.slots
        seen = []
        for slot in slots:
            def forward(tokens, want="all", shift=True, run=slot.model.forward):
                seen.append(want)
                return run(tokens, want, shift)

            slot.model.forward = forward
        text, finish, n = _ask(server, *REQUESTS[0], False)
        assert n > 1 and seen and "rows" not in seen  # only the prompt went through it
        assert sum(s.speculation.proposed for s in slots) > 0
    finally:
        server.stop()


def test_streams_chunk_by_chunk_as_the_plain_server(models):
    plain, spec = models
    want, _, _ = _answers(plain, stream=True)
    got, _, _ = _answers(spec, stream=True)
    assert got == want


def test_serve_draft_takes_lookup_only():
    out = subprocess.run([sys.executable, "-m", "edgellm", "serve", "-m", str(smollm2()),
                          "--draft", "small.edgellm", "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--draft" in out.stderr and "lookup" in out.stderr
    assert "Traceback" not in out.stderr
