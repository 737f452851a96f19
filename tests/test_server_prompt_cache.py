"""The server's prompt cache (--prompt-cache-bytes): one LRU of earlier sequences' KV shared
by every slot of a chat model, so clients sending the same long system prompt prefill only
their own question, on whichever slot they land; the hits are reported in each API's usage
and in /metrics; greedy answers are those of a full prefill; the LRU keeps to its bytes."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from conftest import warm_smollm2  # noqa: E402
from server_helpers import ThreadServer, request  # noqa: E402

from edgellm.cache.prompt_cache import common_prefix  # noqa: E402

# ~1,500 tokens of SmolLM2's tokenizer
SYSTEM = " ".join(f"Rule {i}: answer politely and cite the handbook section {i}."
                  for i in range(92))
OTHER = " ".join(f"Clause {i}: reply in French and quote the manual chapter {i}."
                 for i in range(92))
QUESTIONS = ["What is 2+2?", "Name a color.", "Where is Paris?", "Who wrote Hamlet?",
             "Name a fruit.", "What is the sun?", "Say hello.", "Count to three."]
MAX_TOKENS = 8


def chat(system: str, question: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def llm(smollm2):
    yield from warm_smollm2(smollm2, 2048)  # room for SYSTEM (test_server's llm: 1,024)


@pytest.fixture(scope="module")
def alone(llm):
    """Each question's greedy answer from a full prefill (the model's cache emptied first)."""
    out = {}
    for q in QUESTIONS[:4]:
        llm.model.reset()
        r = llm.create_chat_completion(chat(SYSTEM, q), max_tokens=MAX_TOKENS, temperature=0)
        out[q] = r["choices"][0]["message"]["content"]
    return out


@pytest.fixture()
def server(llm):
    s = ThreadServer(llm, parallel=2)
    yield s
    s.stop()


def ask(server, system: str, question: str):
    return server.client().with_options(timeout=900).chat.completions.create(
        model="smollm2", messages=chat(system, question), max_tokens=MAX_TOKENS,
        temperature=0)


def metric(server, name: str) -> float:
    _, _, body = request(server.url + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_eight_clients_prefill_the_shared_system_prompt_once(alone, server):
    """The first client's sequence is offered to the cache; the next seven, two slots at
    once, each restore it (on the slot that never saw it too) and prefill < 10%."""
    first = ask(server, SYSTEM, QUESTIONS[0])
    assert first.usage.prompt_tokens > 1400
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    answers = {QUESTIONS[0]: first}
    threads = [threading.Thread(target=lambda q=q: answers.__setitem__(q, ask(server, SYSTEM,
                                                                             q)))
               for q in QUESTIONS[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    later = [answers[q].usage for q in QUESTIONS[1:]]
    for usage in later:
        assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens, usage
    batch = server.app.state.batch
    assert sum(s.prompt_cache.reused > 0 for s in batch.slots) == 2  # every slot hit
    assert metric(server, "edgellm_prompt_cache_hits_total") == 7
    assert metric(server, "edgellm_prompt_cache_tokens_total") == sum(
        u.prompt_tokens_details.cached_tokens for u in later)
    for q, text in alone.items():  # greedy answers as a full prefill gives them
        assert answers[q].choices[0].message.content == text, q


def test_anthropic_and_responses_report_the_cached_tokens(server, llm):
    ask(server, SYSTEM, QUESTIONS[0])
    head = {"x-api-key": "none"}
    status, _, body = request(server.url + "/v1/messages", {
        "model": "smollm2", "max_tokens": 4, "system": SYSTEM, "temperature": 0,
        "messages": [{"role": "user", "content": QUESTIONS[1]}]}, head, timeout=900)
    assert status == 200
    usage = json.loads(body)["usage"]
    prompt = len(llm.encode_prompt(chat(SYSTEM, QUESTIONS[1])))
    assert usage["cache_read_input_tokens"] >= 0.9 * prompt
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt
    status, _, body = request(server.url + "/v1/responses", {
        "model": "smollm2", "max_output_tokens": 4, "instructions": SYSTEM,
        "temperature": 0, "input": QUESTIONS[2]}, head, timeout=900)
    assert status == 200
    usage = json.loads(body)["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= 0.9 * usage["input_tokens"]


def test_completions_report_the_cached_tokens(server):
    """/v1/completions' usage, whole and streamed, says what the prompt cache gave."""
    c = server.client().with_options(timeout=900)
    first = c.completions.create(model="smollm2", prompt=SYSTEM + "\nQ: 2+2?\nA:",
                                 max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = c.completions.create(model="smollm2", prompt=SYSTEM + "\nQ: a color?\nA:",
                                 max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens
    chunks = list(c.completions.create(model="smollm2", prompt=SYSTEM + "\nQ: a fruit?\nA:",
                                       max_tokens=4, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_a_different_system_prompt_gets_no_false_hit(alone, server, llm):
    """Only the ids the two prompts share (the template's head) come from the cache."""
    ask(server, SYSTEM, QUESTIONS[0])
    r = ask(server, OTHER, QUESTIONS[1])
    shared = common_prefix(llm.encode_prompt(chat(SYSTEM, QUESTIONS[0])),
                           llm.encode_prompt(chat(OTHER, QUESTIONS[1])))
    assert shared < 10
    assert r.usage.prompt_tokens_details.cached_tokens == shared
    again = ask(server, SYSTEM, QUESTIONS[1])  # the first is still cached beside it
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens
    assert again.choices[0].message.content == alone[QUESTIONS[1]]


def test_the_cache_keeps_to_its_bytes_and_evicts_the_oldest(llm):
    """Room for two of three short conversations: the oldest is evicted, the others hit;
    one slot, so only the shared cache (not the slot's live sequence) can give the hits."""
    layers = llm.model.cache.layers
    per_token = sum(x.k[:1].nbytes + x.v[:1].nbytes + x.pos[:1].nbytes for x in layers)
    systems = [f"You are assistant {name}. " + " ".join(f"Fact {i} about {name}."
                                                      for i in range(40))
               for name in ("Ann", "Bob", "Cid")]
    n = max(len(llm.encode_prompt(chat(s, QUESTIONS[0]))) for s in systems) + MAX_TOKENS
    budget = int(per_token * n * 2.5)
    s = ThreadServer(llm, parallel=1, prompt_cache_bytes=budget)
    try:
        for system in systems:
            ask(s, system, QUESTIONS[0])
        lru = s.app.state.batch.prompt_cache
        assert 0 < lru.nbytes <= budget and len(lru.entries) == 2
        # Ann's was evicted; her new sequence evicts Bob's, Cid's is still there
        for system, hit in ((systems[0], False), (systems[2], True), (systems[1], False)):
            r = ask(s, system, QUESTIONS[1])
            cached = r.usage.prompt_tokens_details.cached_tokens
            assert (cached >= 0.8 * r.usage.prompt_tokens) is hit, (system[:20], cached)
            assert lru.nbytes <= budget and len(lru.entries) == 2
    finally:
        s.stop()


def test_no_cache_bytes_turns_it_off(llm):
    s = ThreadServer(llm, parallel=2, prompt_cache_bytes=0)
    try:
        assert s.app.state.batch.prompt_cache is None
        ask(s, SYSTEM, QUESTIONS[0])
        ask(s, OTHER, QUESTIONS[0])
        # OTHER went to the slot holding SYSTEM (their longest common prefix, the template's
        # head) and replaced it: without the shared cache SYSTEM is prefilled again
        r = ask(s, SYSTEM, QUESTIONS[1])
        assert r.usage.prompt_tokens_details.cached_tokens < 0.1 * r.usage.prompt_tokens
    finally:
        s.stop()
