"""What one server serves, found by a request's `model`: the chat engine, the embedder
and the reranker.

    served = Served(engine, settings, embedder, reranker)
    engine = served.chat(req.model)           # 404 in the API's shape when not served
    embedder, name = served.embedder(req.model)
    reranker, name = served.reranker(req.model)
    for name, kind, llm in served.loaded(): ...   # kind: "chat", "embedding", "rerank"
"""

from __future__ import annotations

import time

from ..llm import LLM
from .engine import Engine, Settings
from .errors import APIError


class Served:
    """The models of one server: `engine` (its chat model's), `embedder` and `reranker`
    (or None)."""

    def __init__(self, engine: Engine, settings: Settings, embedder: LLM | None = None,
                 reranker: LLM | None = None):
        self.engine, self.settings, self._embedder = engine, settings, embedder
        self._reranker = reranker
        self.created = int(time.time())

    def loaded(self) -> list[tuple[str, str, LLM]]:
        """(name, kind, model) of each model loaded."""
        s = self.settings
        return [(s.model_id, "chat", self.engine.llm)] + [
            (name, kind, llm) for name, kind, llm in (
                (s.embedding_id, "embedding", self._embedder),
                (s.rerank_id, "rerank", self._reranker)) if llm is not None]

    def ids(self) -> list[str]:
        return [name for name, _, _ in self.loaded()]

    def card(self, name: str) -> dict:
        """OpenAI's model object for `name` (404 when it is not served)."""
        check_model(name, self.ids())
        return {"id": name, "object": "model", "created": self.created, "owned_by": "edgellm"}

    def chat(self, name: str) -> Engine:
        """The engine answering chats and completions for model `name`."""
        check_model(name, [self.settings.model_id])
        return self.engine

    def embedder(self, name: str) -> tuple[LLM, str]:
        """The embedding model `name` and the name it answers with."""
        return _found(self._embedder, name, self.settings.embedding_id, "embedding",
                      "--embedding-model")

    def reranker(self, name: str) -> tuple[LLM, str]:
        """The cross-encoder `name` and the name it answers with."""
        return _found(self._reranker, name, self.settings.rerank_id, "rerank",
                      "--rerank-model")


def _found(llm: LLM | None, name: str, served_as: str | None, kind: str,
           option: str) -> tuple[LLM, str]:
    if llm is None:
        raise APIError(404, f"no {kind} model is loaded (start the server with {option} "
                       "MODEL)", "not_found_error", "model", "model_not_found")
    check_model(name, [served_as])
    return llm, served_as


def check_model(name: str, ids: list[str]) -> None:
    if name not in ids:
        raise APIError(404, f"model {name!r} is not served here (serving: "
                       f"{', '.join(ids) or 'none'})", "not_found_error", "model",
                       "model_not_found")
