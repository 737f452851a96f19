"""GET /metrics: the server's counters in Prometheus' text format (prometheus_client, on a
registry of each app's own: a process may hold several apps, as the tests do).

    add_routes(app, served)   GET /metrics; counts every request; meters every generation

    edgellm_requests_total{endpoint, status}     each response, by route (its path template:
                                                 "other" for an unknown path) and status
    edgellm_prompt_tokens_total{model}           a generation's prompt, as usage counts it
    edgellm_generated_tokens_total{model}        its tokens, as usage counts them
    edgellm_time_to_first_token_seconds{model}   from asking for a slot to the first token
    edgellm_time_per_output_token_seconds{model} between two tokens of one generation
    edgellm_prompt_cache_hits_total{model}       prompts that started from a cached prefix
    edgellm_prompt_cache_tokens_total{model}     prompt tokens taken from the cache, not run
    edgellm_requests_waiting, edgellm_slots_busy, edgellm_slots       read when scraped
    edgellm_model_loaded{model, kind}            1 per model served (kind: chat, embedding,
                                                 rerank)
    edgellm_model_file_bytes{model}              its mapped file
    edgellm_kv_cache_bytes{model}                the chat model's slots' KV caches

A generation is metered where its slot runs it (batch.SlotLLM.meter: the chunks of each
stream_ids, whatever API asked for them); the engine marks when a request asked for its slot
(Engine.slot_for), which also tells a request's first stream from its later phases (a chat
that thinks continues its generation in a second one).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Sequence

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.routing import Match

from .models import Served

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5)


class Metrics:
    """One app's metrics (see the module doc) on its own CollectorRegistry."""

    def __init__(self, served: Served):
        self.served = served
        r = self.registry = CollectorRegistry()
        self.requests = Counter("edgellm_requests", "HTTP requests answered, by route and "
                                "status", ["endpoint", "status"], registry=r)
        by_model = dict(labelnames=["model"], registry=r)
        self.prompt = Counter("edgellm_prompt_tokens", "Prompt tokens of the generations",
                              **by_model)
        self.generated = Counter("edgellm_generated_tokens", "Tokens generated", **by_model)
        self.ttft = Histogram("edgellm_time_to_first_token_seconds", "From asking for a slot "
                              "to the first generated token", buckets=TTFT_BUCKETS, **by_model)
        self.per_token = Histogram("edgellm_time_per_output_token_seconds", "Between two "
                                   "tokens of one generation", buckets=PER_TOKEN_BUCKETS,
                                   **by_model)
        self.cache_hits = Counter("edgellm_prompt_cache_hits", "Prompts that started from a "
                                  "cached prefix", **by_model)
        self.cache_tokens = Counter("edgellm_prompt_cache_tokens", "Prompt tokens taken from "
                                    "the cache instead of prefilled", **by_model)
        r.register(_Gauges(served))
        served.on_engine(self.attach)  # each chat model's, now and as they load

    def attach(self, engine) -> None:
        """Count the streams of `engine`'s slots."""
        for slot in engine.pool.slots:
            slot.meter = functools.partial(self.meter, engine.model_id)

    def meter(self, model: str, slot, ids: Sequence[int], chunks: Iterator) -> Iterator:
        """`chunks` (one stream_ids of `slot` on prompt `ids`) counted as they pass; on
        the worker thread that pulls them."""
        asked, slot.asked = slot.asked, None  # set: the first stream of a request
        if asked is not None:
            self.prompt.labels(model).inc(len(ids))
        last = None
        with contextlib.closing(chunks):  # closed with this one: the generation ends now
            for i, chunk in enumerate(chunks):
                if i == 0 and asked is not None:  # its prompt is in the cache now
                    reused = getattr(slot.prompt_cache, "reused", 0)
                    if reused:
                        self.cache_hits.labels(model).inc()
                        self.cache_tokens.labels(model).inc(reused)
                if chunk.token is not None:
                    now = time.monotonic()
                    self.generated.labels(model).inc()
                    if last is not None:
                        self.per_token.labels(model).observe(now - last)
                    elif asked is not None:
                        self.ttft.labels(model).observe(now - asked)
                    last = now
                yield chunk


class _Counted:
    """ASGI middleware: each response counted by route and status (a request that ends in
    an exception before its response, as the 500 the server answers)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.requests = app, metrics.requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = _endpoint(scope["app"].router.routes, scope)
        status = None

        async def sent(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.requests.labels(endpoint, str(status)).inc()
            await send(message)

        try:
            await self.app(scope, receive, sent)
        except BaseException:
            if status is None:
                self.requests.labels(endpoint, "500").inc()
            raise


def _endpoint(routes, scope) -> str:
    """The path template of the route `scope` goes to ("other" for none: the label's values
    stay bounded whatever paths clients send)."""
    found = "other"
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route.path
        if match == Match.PARTIAL and found == "other":  # the path, another method: a 405
            found = route.path
    return found


class _Gauges:
    """The values read when scraped: the pool's queue and slots, the models loaded."""

    def __init__(self, served: Served):
        self.served = served

    def collect(self):
        engines = self.served.engines()
        pools = [e.pool for e in engines]
        yield GaugeMetricFamily("edgellm_requests_waiting", "Requests waiting for a slot",
                                value=sum(len(p.waiting) for p in pools))
        yield GaugeMetricFamily("edgellm_slots_busy", "Slots generating",
                                value=sum(p.busy for p in pools))
        yield GaugeMetricFamily("edgellm_slots", "Slots of the chat models loaded",
                                value=sum(len(p.slots) for p in pools))
        loaded = GaugeMetricFamily("edgellm_model_loaded", "Models loaded",
                                   labels=["model", "kind"])
        size = GaugeMetricFamily("edgellm_model_file_bytes", "Bytes of the model's file, "
                                 "mapped", labels=["model"])
        for name, kind, llm in self.served.loaded():
            loaded.add_metric([name, kind], 1)
            size.add_metric([name], llm.packed.file_size)
        kv = GaugeMetricFamily("edgellm_kv_cache_bytes", "Bytes of each chat model's slots' "
                               "KV caches", labels=["model"])
        for e in engines:
            kv.add_metric([e.model_id], sum(s.model.cache.nbytes for s in e.pool.slots
                                            if s.model is not None))
        yield from (loaded, size, kv)


def add_routes(app: FastAPI, served: Served) -> Metrics:
    """GET /metrics, the counting middleware (outermost: it sees the 401s and 413s the
    limits answer) and the slots' meters."""
    metrics = Metrics(served)
    app.add_middleware(_Counted, metrics=metrics)

    @app.get("/metrics")
    async def scrape():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics

