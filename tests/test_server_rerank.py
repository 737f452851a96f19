"""POST /v1/rerank and /rerank (llama.cpp's shape) on the tiny cross-encoder of
tests/fixtures/heads: the scores LLM.rerank gives (tested against sentence-transformers'
CrossEncoder in test_heads.py), top_n, return_documents, documents as objects, usage, and
the errors (no reranker, unknown model, bad and too many documents)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from conftest import FIXTURES, load_converted  # noqa: E402
from server_helpers import ThreadServer, request  # noqa: E402

import edgellm  # noqa: E402

HEADS = FIXTURES / "heads"


def _ref():
    return json.loads((HEADS / "cross-encoder" / "reference.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    yield from load_converted(tmp_path_factory, HEADS / "cross-encoder", threads=1)


@pytest.fixture(scope="module")
def server(smollm2, reranker):
    with edgellm.load(smollm2, context=512) as llm:
        s = ThreadServer(llm, reranker=reranker, rerank_id="tiny-reranker", max_inputs=40)
        yield s
        s.stop()


def _rerank(server, body, path="/v1/rerank"):
    status, _, raw = request(server.url + path, body)
    return status, json.loads(raw)


def test_scores_are_llm_reranks_on_every_set(server, reranker):
    ref = _ref()
    assert len(ref["sets"]) == 20
    for s in ref["sets"]:
        status, r = _rerank(server, {"model": "tiny-reranker", "query": s["query"],
                                     "documents": s["documents"]})
        assert status == 200, r
        want = reranker.rerank(s["query"], s["documents"])
        assert [x["index"] for x in r["results"]] == [x["index"] for x in want]
        by_cross_encoder = sorted(range(len(s["scores"])), key=lambda i: -s["scores"][i])
        assert [x["index"] for x in r["results"]] == by_cross_encoder
        for got, w in zip(r["results"], want):
            assert set(got) == {"index", "relevance_score"}
            assert abs(got["relevance_score"] - w["relevance_score"]) < 1e-6
            assert abs(got["relevance_score"] - s["scores"][got["index"]]) < 1e-4  # CrossEncoder
        assert r["model"] == "tiny-reranker" and r["object"] == "list"
        heads = reranker.heads
        n = sum(len(e.ids) for e in reranker.tokenizer.encodings(
            [s["query"]] * len(s["documents"]), s["documents"], heads.max_length))
        assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_more_documents_than_one_engine_turn_and_the_long_set(server, reranker):
    """40 documents (PAIRS_PER_CALL a turn) and the set past the model's 128 positions."""
    ref = _ref()
    docs = [d for s in ref["sets"] for d in s["documents"]][:40]
    status, r = _rerank(server, {"model": "tiny-reranker", "query": "where do cats sleep",
                                 "documents": docs})
    assert status == 200
    want = reranker.rerank("where do cats sleep", docs)
    assert [x["index"] for x in r["results"]] == [x["index"] for x in want]
    assert max(abs(a["relevance_score"] - b["relevance_score"])
               for a, b in zip(r["results"], want)) < 1e-6
    long = ref["long"]
    status, r = _rerank(server, {"model": "tiny-reranker", "query": long["query"],
                                 "documents": long["documents"]}, "/rerank")
    assert status == 200
    for x in r["results"]:
        assert abs(x["relevance_score"] - long["scores"][x["index"]]) < 1e-4


def test_top_n_return_documents_and_document_objects(server):
    s = _ref()["sets"][3]
    ranking = [x["index"] for x in s["ranking"]]
    status, r = _rerank(server, {"model": "tiny-reranker", "query": s["query"],
                                 "documents": [{"text": d} for d in s["documents"]],
                                 "top_n": 2, "return_documents": True}, "/rerank")
    assert status == 200
    assert [x["index"] for x in r["results"]] == ranking[:2]
    for x in r["results"]:
        assert x["document"] == {"text": s["documents"][x["index"]]}
    # the model may be left out (llama.cpp's clients): the one reranker answers
    status, r = _rerank(server, {"query": s["query"], "documents": s["documents"],
                                 "top_n": 50})
    assert status == 200 and [x["index"] for x in r["results"]] == ranking


@pytest.mark.parametrize("body, param, words", [
    ({"model": "smollm2", "query": "q", "documents": ["a"]}, "model", "not served"),
    ({"model": "tiny-reranker", "query": "q", "documents": []}, "documents", "1..40"),
    ({"model": "tiny-reranker", "query": "q", "documents": ["a"] * 41}, "documents", "got 41"),
    ({"model": "tiny-reranker", "query": "q", "documents": ["a", 3]}, "documents",
     "documents[1]"),
    ({"model": "tiny-reranker", "query": "q", "documents": [{"txt": "a"}]}, "documents",
     "without one"),
    ({"model": "tiny-reranker", "query": "q", "documents": ["a" * 70000]}, "documents",
     "documents[0] is 70000 characters"),
    ({"model": "tiny-reranker", "query": "\ud800", "documents": ["a"]}, "query",
     "not valid Unicode"),
    ({"model": "tiny-reranker", "query": "q", "documents": ["a"], "top_n": 0}, "top_n", ""),
    ({"model": "tiny-reranker", "documents": ["a"]}, "query", ""),
])
def test_errors_name_the_field(server, body, param, words):
    status, r = _rerank(server, json.dumps(body).encode())
    code = 404 if param == "model" else 400
    assert status == code, r
    assert r["error"]["param"] == param and words in r["error"]["message"]


def test_no_reranker_loaded_is_a_404(server):
    s = ThreadServer(server.app.state.served.engine.llm)
    try:
        status, r = _rerank(s, {"model": "x", "query": "q", "documents": ["a"]})
        assert status == 404 and "--rerank-model" in r["error"]["message"]
        assert r["error"]["code"] == "model_not_found"
    finally:
        s.stop()


def test_serve_refuses_a_rerank_model_that_is_not_a_cross_encoder(smollm2, capsys):
    from edgellm.cli import main

    assert main(["serve", "-m", str(smollm2), "--port", "0",
                 "--rerank-model", str(smollm2)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a text generator, not a reranker" in err
