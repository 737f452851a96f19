"""Prompt lookup decoding through the API and the CLI (edgellm.load(draft="lookup")): the
output is plain decoding's token for token, also with sampling, stop strings, logit_bias,
penalties and constraints, chunks arrive token by token, and stats count the guesses;
the proposer and the tuner alone."""

import json
import subprocess
import sys

import pytest
from speculative_models import smollm2

import edgellm
from edgellm.errors import ArgumentError
from edgellm.speculative.lookup import LookupProposer
from edgellm.speculative.tuner import Tuner

DOC = ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n")
EDIT = [{"role": "user", "content": "Rename area to rect_area and give back all the code:\n"
         + DOC}]
RECORD = ("Name: Ada Lovelace\nBorn: 10 December 1815, London\nKnown for: the first "
          "published algorithm, for Babbage's Analytical Engine\nFather: Lord Byron\n")
EXTRACT = [{"role": "user", "content": RECORD + "\nAnswer in JSON with the keys name, born "
            "and known_for, copying the values."}]


def test_lookup_finds_the_last_continuation():
    p = LookupProposer()
    h = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert p.propose(h, 3) == [4, 5, 9]
    h += [4, 7, 7, 2, 3]
    assert p.propose(h, 2) == [4, 7]  # the latest occurrence of (2, 3)
    assert p.propose([5, 6, 7], 4) == []
    assert p.propose(h, 0) == []



def test_lookup_reads_a_repeating_pattern_on_through_its_guesses():
    # the match 3 tokens back leaves only 3 to copy; the pattern goes on past them
    assert LookupProposer().propose([1, 2, 3, 1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]
    assert LookupProposer().propose([5, 0, 0, 0], 4) == [0, 0, 0, 0]
    assert LookupProposer().propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]

def test_tuner_guesses_more_when_accepted_and_stops_when_not():
    t = Tuner(8)
    t.secs = {n: 1.0 + 0.2 * (n - 1) for n in range(1, 9)}
    t.seen = set(range(1, 9))
    for _ in range(20):
        t.observe(4, 4)
    assert t.length(7) >= 4
    t.start()
    for _ in range(20):
        t.observe(3, 0)
    assert t.length(7) == 0
    lengths = [t.length(7) for _ in range(100)]
    assert 0 < sum(lengths) <= 12  # a probe now and then
    assert t.length(0) == 0



def test_tuner_keeps_each_kind_of_guess_apart():
    # lookup's long matches are taken, its short ones not: the short ones stop alone
    t = Tuner(8)
    t.secs = {n: 1.0 + 0.3 * (n - 1) for n in range(1, 9)}
    t.seen = set(range(1, 9))
    for _ in range(20):
        t.observe(7, 7, kind=4)
        t.observe(3, 0, kind=2)
    assert t.length(7, kind=4) >= 4
    assert t.length(7, kind=2) == 0
    assert t.acceptance(4) > 0.9 > 0.1 > t.acceptance(2)

def test_tuner_weighs_a_drafts_cost_and_stops_it_for_the_generation():
    # a draft step costs half a target step (SmolLM2-135M q4_0 against q8_0): a guess taken
    # half the time does not pay for its draft step, one always taken does
    t = Tuner(8, guess_prior=0.5)
    assert t.length(7) == 0  # no timed plain step yet: a plain step, to time it
    t.secs = {1: 1.0, 2: 1.12, 3: 1.45, 4: 1.76, 5: 2.26, 6: 2.57, 7: 3.05, 8: 3.34}
    t.seen = set(range(1, 9))
    t.guessed(1, 0.5)  # the first timing is left out
    t.guessed(3, 1.5)
    assert t.guess_cost() == pytest.approx(0.5)
    for taken in (1, 0, 1, 0):
        assert t.length(7) >= 1  # guessing while the acceptance is measured
        t.observe(1, taken)
    for _ in range(20):  # the one-row step is timed again now and then
        t.timed(2, 1.12)
    assert t.length(7) == 0 and t.since_plain >= 16
    t.timed(1, 1.0)
    assert t.length(7) == 0
    assert [t.length(7) for _ in range(200)] == [0] * 200  # no probes: the draft would
    t.start()  # have to catch up on every token it missed
    for _ in range(20):
        t.observe(9, 8)  # 8 guesses in 9 taken, still no gain: the draft reads every token
    assert t.length(7) == 0
    cheap = Tuner(8, guess_prior=0.2)  # a draft at a fifth of a step pays
    cheap.secs, cheap.seen = t.secs, t.seen
    free = Tuner(8)  # the same costs and acceptance, guesses free (lookup): no shorter
    free.secs, free.seen = t.secs, t.seen
    for _ in range(20):
        cheap.observe(9, 8)
        free.observe(9, 8)
    k = cheap.length(7)
    assert k >= 1
    assert free.length(7) >= k


@pytest.fixture(scope="module")
def pair():
    with edgellm.load(smollm2(), draft="lookup") as spec, edgellm.load(smollm2()) as plain:
        yield spec, plain


def _both(pair, prompt, **kw):
    outs = []
    for llm in pair:
        with llm.stream(prompt, **kw) as chunks:
            outs.append(list(chunks))
    return outs


@pytest.mark.parametrize("kw", [
    dict(max_tokens=80),
    dict(max_tokens=60, temperature=0.8, seed=3),
    dict(max_tokens=60, temperature=0.7, top_p=0.9, top_k=40, seed=11),
    dict(max_tokens=60, stop=["rect_area("]),
    dict(max_tokens=50, logit_bias={28: -5.0, 30: 2.0}),
    dict(max_tokens=50, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2),
])
def test_same_tokens_as_plain_decoding(pair, kw):
    spec, plain = _both(pair, EDIT, **kw)
    assert [c.token for c in spec] == [c.token for c in plain]
    assert "".join(c.text for c in spec) == "".join(c.text for c in plain)
    assert spec[-1].finish_reason == plain[-1].finish_reason
    assert spec[-1].stop == plain[-1].stop
    assert all(c.token is not None for c in spec[:-1])  # a chunk a token


def test_guesses_counted_and_speculative_off(pair):
    pair[0].speculation.tuner.secs.clear()  # the prior costs: earlier tests' timings aside
    spec, plain = _both(pair, EXTRACT, max_tokens=60)
    stats = spec[-1].stats
    assert stats.proposed_tokens > 0 and 0 < stats.accepted_tokens <= stats.proposed_tokens
    assert "accepted" in stats.line()
    assert plain[-1].stats.proposed_tokens == 0
    with pair[0].stream(EXTRACT, max_tokens=20, speculative=False) as chunks:
        last = list(chunks)[-1]
    assert last.stats.proposed_tokens == 0


def test_constrained_output_as_plain(pair):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "born": {"type": "string"}},
              "required": ["name", "born"]}
    spec, plain = _both(pair, EXTRACT, max_tokens=60, json_schema=schema)
    assert [c.token for c in spec] == [c.token for c in plain]
    json.loads("".join(c.text for c in spec))


def test_chat_and_chat_completion_as_plain(pair):
    spec, plain = pair
    a = spec.create_chat_completion(EXTRACT, max_tokens=40)
    b = plain.create_chat_completion(EXTRACT, max_tokens=40)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    pieces = [c["choices"][0]["delta"].get("content") for c in
              spec.create_chat_completion(EXTRACT, max_tokens=40, stream=True)]
    assert "".join(p for p in pieces if p) == b["choices"][0]["message"]["content"]
    c = spec.create_chat_completion(EXTRACT, max_tokens=10, speculative=False)
    assert c["choices"][0]["message"]["content"]
    answers = []
    for llm in pair:
        session = llm.chat()
        turn = []
        for msg in ("Repeat exactly: the cat sat on the mat.", "Again, the same words."):
            turn.append("".join(c.text for c in session.send(msg, max_tokens=30)))
        answers.append(turn)
    assert answers[0] == answers[1]


def test_bad_draft_argument(tmp_path):
    with pytest.raises(ArgumentError, match="draft"):
        edgellm.load(smollm2(), draft=3)
    with pytest.raises(edgellm.EdgeLLMError):
        edgellm.load(smollm2(), draft=str(tmp_path / "missing.edgellm"))
    with edgellm.load(smollm2(), draft="lookup") as llm:
        with pytest.raises(ArgumentError, match="speculative"):
            llm.generate("hi", speculative="yes")


def test_cli_draft_lookup():
    out = subprocess.run([sys.executable, "-m", "edgellm", "generate", "-m", str(smollm2()),
                          "--draft", "lookup", "-n", "24", "--verbose", "-p",
                          "Copy this: alpha beta gamma delta alpha beta gamma"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "guessed" in out.stderr or "generated" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "edgellm", "generate", "-m", str(smollm2()),
                          "--draft", "/nonexistent.edgellm", "-p", "hi"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
