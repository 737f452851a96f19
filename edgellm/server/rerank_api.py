"""Reranking in the shape llama.cpp's server answers (and Jina's and Cohere's clients read):
documents scored against a query by a cross-encoder (LLM.rerank), best first.

    add_routes(app, served)   POST /v1/rerank, /rerank

    request:  {"model", "query", "documents": [str | {"text": str}], "top_n"?,
               "return_documents"?: false}
    response: {"model", "object": "list", "results": [{"index", "relevance_score",
               "document"?: {"text"}}], "usage": {"prompt_tokens", "total_tokens"}}

Each (query, document) pair is scored as sentence-transformers' CrossEncoder scores it
(heads.py), cut to the model's length; usage counts the pairs' tokens after the cut. The
pairs run on the engine's thread (Batch.call) a few at a time, so that the slots' decoding
goes on between them instead of waiting for a long list.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..arguments import text as checked_text
from ..errors import EdgeLLMError
from .errors import APIError, from_edgellm
from .models import Served

PAIRS_PER_CALL = 16  # pairs scored in one turn of the engine's thread
MAX_TEXT_CHARS = 1 << 16  # a query's or a document's (the model reads its first tokens)


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # Cohere's max_tokens_per_doc, Jina's ...

    model: str | None = None  # llama.cpp's clients may leave it out: the one reranker
    query: str
    documents: list[Any]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool | None = False


def add_routes(app: FastAPI, served: Served) -> None:
    settings = served.settings

    @app.post("/v1/rerank")
    @app.post("/rerank")
    async def rerank(req: RerankRequest):
        reranker, name = served.reranker(settings.rerank_id if req.model is None
                                         else req.model)
        query = _text(req.query, "query", "query")
        if not req.documents or len(req.documents) > settings.max_inputs:
            raise APIError(400, f"documents: give 1..{settings.max_inputs} documents, got "
                           f"{len(req.documents)}", param="documents")
        docs = [_text(_document(d, i), f"documents[{i}]", "documents")
                for i, d in enumerate(req.documents)]
        fields = {"query", "documents"}
        scores = [0.0] * len(docs)
        try:
            for s in range(0, len(docs), PAIRS_PER_CALL):
                for r in await served.call(name, reranker.rerank, query,
                                           docs[s:s + PAIRS_PER_CALL]):
                    scores[s + r["index"]] = r["relevance_score"]
            pairs = await run_in_threadpool(reranker.tokenizer.encodings, [query] * len(docs),
                                            docs, reranker.heads.max_length)
        except EdgeLLMError as e:
            raise from_edgellm(e, fields) from None
        n = sum(len(e.ids) for e in pairs)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:req.top_n]  # ties: as sent
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": docs[i]}} if req.return_documents else {})}
                   for i in order]
        return {"model": name, "object": "list", "results": results,
                "usage": {"prompt_tokens": n, "total_tokens": n}}


def _document(d: Any, i: int) -> str:
    """A document's text: a string, or an object with a "text" string (Jina's, Cohere's)."""
    if isinstance(d, dict) and isinstance(d.get("text"), str):
        return d["text"]
    if isinstance(d, str):
        return d
    got = "an object without one" if isinstance(d, dict) else \
        "null" if d is None else type(d).__name__
    raise APIError(400, f"documents[{i}]: give a string or an object with a \"text\" "
                   f"string, got {got}", param="documents")


def _text(t: str, where: str, param: str) -> str:
    """`t` if it is text the tokenizer takes (no lone surrogate) of at most MAX_TEXT_CHARS."""
    if len(t) > MAX_TEXT_CHARS:
        raise APIError(400, f"{where} is {len(t)} characters: at most {MAX_TEXT_CHARS} are "
                       "allowed (the model reads only its first tokens)", param=param)
    try:
        return checked_text(t, where)
    except EdgeLLMError as e:
        raise APIError(400, str(e), param=param) from None
