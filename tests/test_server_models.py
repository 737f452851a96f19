"""Several models in one server (`edgellm serve -m A -m B --embedding-model E
--max-memory SIZE`): routed by the request's `model`, loaded on first use, the least
recently used idle model closed when the next would pass the budget, and reloaded when
asked for again; the process's memory stays within the budget."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from conftest import FIXTURES  # noqa: E402
from server_helpers import request, serve_subprocess  # noqa: E402

import edgellm  # noqa: E402

BERT = FIXTURES / "embed" / "bert-tiny"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
CACHE = 8 << 20  # each chat model's prompt cache (--prompt-cache-bytes), in its plan


@pytest.fixture(scope="module")
def users_step():
    """The servers here compile each model's own step, as users' do, not the suite's step
    with every op (conftest): that one's code, resident once loaded, is not what the
    budget's SERVER_BASELINE plans for."""
    saved = os.environ.pop("EDGELLM_FUSED", None)
    yield
    if saved is not None:
        os.environ["EDGELLM_FUSED"] = saved


@pytest.fixture(scope="module")
def files(smollm2, tmp_path_factory, users_step):
    """Two chat model files (copies of SmolLM2: separate mappings) and a BERT encoder."""
    from converter.hf_source import open_hf
    from converter.pack import convert

    root = tmp_path_factory.mktemp("models")
    a, b = root / "alpha.edgellm", root / "beta.edgellm"
    shutil.copyfile(smollm2, a)
    shutil.copyfile(smollm2, b)
    bert = root / "bert-tiny.edgellm"
    convert(open_hf(BERT), bert, "f32", progress=False)
    _warm_kernels(a, bert)
    return a, b, bert


def _warm_kernels(chat, bert) -> None:
    """One server with room for all answers once with each model, so that the measured servers load
    every kernel from the cache: a kernel compiled in the measured process (a cache that
    other test workers have not filled yet) would add the compiler's memory to its peak."""
    proc, url = serve_subprocess(chat, "--embedding-model", str(bert), "--ctx", "512",
                                 "--max-memory", str(4 << 30), "--max-tokens", "16", wait=600)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               timeout=600)
        client.chat.completions.create(model="alpha", messages=ASK, max_tokens=8,
                                       temperature=0)
        client.embeddings.create(model="bert-tiny", input=["hello there"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _planned(path, context: int | None) -> int:
    from edgellm.server.models import planned_bytes

    with edgellm.load(path, context=context) as llm:
        return planned_bytes(llm)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_two_chat_models_and_an_embedder_under_a_budget_that_fits_two(files):
    from edgellm.server.models import SERVER_BASELINE as BASELINE

    a, b, bert = files
    ctx = 512
    each = _planned(a, ctx) + CACHE
    budget = BASELINE + each + _planned(bert, None) + (8 << 20)  # two of the three
    assert budget < BASELINE + 2 * each
    proc, url = serve_subprocess(a, "-m", str(b), "--embedding-model", str(bert),
                                 "--ctx", str(ctx), "--max-memory", str(budget),
                                 "--prompt-cache-bytes", str(CACHE), "--max-tokens", "16",
                                 wait=600)
    try:
        status, _, body = request(url + "/v1/models")
        import json

        cards = {m["id"]: m for m in json.loads(body)["data"]}
        assert set(cards) == {"alpha", "beta", "bert-tiny"}
        assert cards["alpha"]["loaded"] and not cards["beta"]["loaded"]
        assert cards["bert-tiny"]["kind"] == "embedding"
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               timeout=300)
        answers, peak = {}, 0
        for _ in range(2):
            for name in ("alpha", "beta", "bert-tiny"):
                if name == "bert-tiny":
                    r = client.embeddings.create(model=name, input=["hello there"])
                    assert len(r.data[0].embedding) > 0
                else:
                    r = client.chat.completions.create(model=name, messages=ASK,
                                                       max_tokens=8, temperature=0)
                    assert r.model == name and r.choices[0].message.content
                    answers.setdefault(name, r.choices[0].message.content)
                    # the same weights: a reloaded model answers as before
                    assert r.choices[0].message.content == answers[name]
                peak = max(peak, _rss(proc.pid))
                loaded = [m["id"] for m in json.loads(request(url + "/v1/models")[2])["data"]
                          if m["loaded"]]
                assert name in loaded and len(loaded) <= 2, loaded
                assert not {"alpha", "beta"} <= set(loaded), loaded
        assert answers["alpha"] == answers["beta"]
        assert peak <= budget * 1.1, (peak >> 20, budget >> 20)
        # a model that is not served: 404 in OpenAI's shape, nothing loaded for it
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gamma", messages=ASK, max_tokens=4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_budget_for_one_model_swaps_them_on_demand(files, tmp_path):
    from edgellm.server.models import SERVER_BASELINE as BASELINE

    a, b, _ = files
    budget = BASELINE + _planned(a, 512) + CACHE + (1 << 20)  # one chat model, never two
    big = tmp_path / "big.edgellm"
    shutil.copyfile(b, big)
    proc, url = serve_subprocess(a, "-m", str(big), "--ctx", "512", "--max-memory",
                                 str(budget), "--prompt-cache-bytes", str(CACHE),
                                 "--max-tokens", "8", wait=600)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               timeout=300)
        # alpha (loaded) is idle: closed for big, and big answers; then alpha again
        for name in ("big", "alpha"):
            r = client.chat.completions.create(model=name, messages=ASK, max_tokens=4,
                                               temperature=0)
            assert r.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_chat_models_prompt_cache_counts_in_the_budget(converted):
    """A chat model's plan counts its prompt cache at its bound (--prompt-cache-bytes): a
    budget that fits two models' plans but not their caches beside them holds one at a
    time (without the cache, the same budget holds both)."""
    import asyncio

    from edgellm.server.engine import Settings
    from edgellm.server.models import SERVER_BASELINE, Served, planned_bytes

    path = converted("llama", "q4_1")
    with edgellm.load(path, context=64) as llm:
        plan = planned_bytes(llm)
    cache = 8 << 20
    budget = SERVER_BASELINE + 2 * plan + cache + (1 << 20)

    async def run(cache_bytes: int):
        served = Served(Settings("a", prompt_cache_bytes=cache_bytes), max_memory=budget,
                        opener=lambda p, kind: edgellm.load(p, context=64), context=64)
        served.add("a", path=path)
        served.add("b", path=path)
        try:
            async with served.lease("a"):
                pass
            async with served.lease("b"):
                return sorted(n for n, _, _ in served.loaded()), served.models["b"].planned
        finally:
            served.close()

    loaded, planned = asyncio.run(run(cache))
    assert loaded == ["b"] and planned == plan + cache  # "a" closed to make room
    loaded, planned = asyncio.run(run(0))
    assert loaded == ["a", "b"] and planned == plan
