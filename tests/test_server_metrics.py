"""GET /metrics: Prometheus' text format (parsed by prometheus_client's own parser) whose
counters move as the requests say: requests by route and status, prompt and generated
tokens equal to the usage the responses report, a time to first token and the times
between tokens per generation, the slots and queue, the models loaded; each app counts on
its own registry."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
parser = pytest.importorskip("prometheus_client.parser")

from server_helpers import ThreadServer, request  # noqa: E402

import edgellm  # noqa: E402

ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm(smollm2):
    with edgellm.load(smollm2, context=1024) as model:
        model.model.warmup()
        yield model


@pytest.fixture()
def server(llm):
    s = ThreadServer(llm, parallel=2, api_key="k")
    yield s
    s.stop()


def scrape(server) -> dict[str, dict]:
    """{family name: {(sample name, sorted labels): value}} of GET /metrics."""
    status, headers, body = request(server.url + "/metrics")
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 200 and headers["content-type"].startswith("text/plain")
    out: dict[str, dict] = {}
    for family in parser.text_string_to_metric_families(body.decode("utf-8")):
        out[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value
                            for s in family.samples}
    return out


def value(m: dict, family: str, sample: str | None = None, **labels) -> float:
    key = (sample or family, tuple(sorted(labels.items())))
    return m.get(family, {}).get(key, 0.0)


def test_counters_move_as_the_requests_say(server):
    before = scrape(server)
    assert value(before, "edgellm_requests", "edgellm_requests_total",
                 endpoint="/v1/chat/completions", status="200") == 0
    c = server.client()
    usage = []
    r = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=5,
                                  temperature=0)
    usage.append(r.usage)
    chunks = list(c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=7,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    usage.append(chunks[-1].usage)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=ASK, max_tokens=2)
    status, _, _ = request(server.url + "/v1/models")  # no key: 401, before any route
    assert status == 401
    request(server.url + "/no/such/path")
    m = scrape(server)
    total = "edgellm_requests_total"
    assert value(m, "edgellm_requests", total, endpoint="/v1/chat/completions",
                 status="200") == 2
    assert value(m, "edgellm_requests", total, endpoint="/v1/chat/completions",
                 status="404") == 1
    assert value(m, "edgellm_requests", total, endpoint="/v1/models", status="401") == 1
    assert value(m, "edgellm_requests", total, endpoint="other", status="404") == 1
    assert value(m, "edgellm_requests", total, endpoint="/metrics", status="200") == 1
    model = {"model": "smollm2"}
    assert value(m, "edgellm_prompt_tokens", "edgellm_prompt_tokens_total",
                 **model) == sum(u.prompt_tokens for u in usage)
    assert value(m, "edgellm_generated_tokens", "edgellm_generated_tokens_total",
                 **model) == sum(u.completion_tokens for u in usage) == 12
    ttft = "edgellm_time_to_first_token_seconds"
    assert value(m, ttft, ttft + "_count", **model) == 2
    assert 0 < value(m, ttft, ttft + "_sum", **model) < 60
    per = "edgellm_time_per_output_token_seconds"
    assert value(m, per, per + "_count", **model) == 12 - 2  # between tokens
    assert value(m, "edgellm_slots") == 2 and value(m, "edgellm_slots_busy") == 0
    assert value(m, "edgellm_requests_waiting") == 0
    assert value(m, "edgellm_model_loaded", model="smollm2", kind="chat") == 1
    assert value(m, "edgellm_model_file_bytes", **model) == server.app.state.served \
        .engine.llm.packed.file_size > 0
    assert value(m, "edgellm_kv_cache_bytes", **model) > 0


def test_a_prompt_cache_hit_counts_the_tokens_it_saved(server):
    """The same conversation again on one slot: its prefix comes from the slot's cache."""
    c = server.client()
    first = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=3,
                                      temperature=0)
    turn = ASK + [{"role": "assistant", "content": first.choices[0].message.content},
                  {"role": "user", "content": "And of Spain?"}]
    c.chat.completions.create(model="smollm2", messages=turn, max_tokens=3, temperature=0)
    m = scrape(server)
    assert value(m, "edgellm_prompt_cache_hits", "edgellm_prompt_cache_hits_total",
                 model="smollm2") == 1
    saved = value(m, "edgellm_prompt_cache_tokens", "edgellm_prompt_cache_tokens_total",
                  model="smollm2")
    assert first.usage.prompt_tokens - 1 <= saved <= first.usage.prompt_tokens + 3


def test_each_app_counts_on_its_own_registry(server, llm):
    c = server.client()
    c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=1)
    other = ThreadServer(llm)
    try:
        m = scrape(other)
        assert value(m, "edgellm_requests", "edgellm_requests_total",
                     endpoint="/v1/chat/completions", status="200") == 0
        status, _, body = request(other.url + "/v1/chat/completions",
                                  {"model": "smollm2", "messages": ASK, "max_tokens": 1})
        assert status == 200
        m = scrape(other)
        assert value(m, "edgellm_generated_tokens", "edgellm_generated_tokens_total",
                     model="smollm2") == json.loads(body)["usage"]["completion_tokens"]
    finally:
        other.stop()
