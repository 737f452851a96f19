"""What one server serves, found by a request's `model`: the chat engine and the embedder.

    served = Served(engine, settings, embedder)
    engine = served.chat(req.model)           # 404 in the API's shape when not served
    embedder, name = served.embedder(req.model)
"""

from __future__ import annotations

import time

from ..llm import LLM
from .engine import Engine, Settings
from .errors import APIError


class Served:
    """The models of one server: `engine` (its chat model's) and `embedder` (or None)."""

    def __init__(self, engine: Engine, settings: Settings, embedder: LLM | None = None):
        self.engine, self.settings, self._embedder = engine, settings, embedder
        self.created = int(time.time())

    def ids(self) -> list[str]:
        return [self.settings.model_id] + (
            [self.settings.embedding_id] if self._embedder is not None else [])

    def card(self, name: str) -> dict:
        """OpenAI's model object for `name` (404 when it is not served), with its `kind`
        (chat or embedding: the chat page lists the chat models)."""
        check_model(name, self.ids())
        kind = "chat" if name == self.settings.model_id else "embedding"
        return {"id": name, "object": "model", "created": self.created, "owned_by": "edgellm",
                "kind": kind}

    def chat(self, name: str) -> Engine:
        """The engine answering chats and completions for model `name`."""
        check_model(name, [self.settings.model_id])
        return self.engine

    def embedder(self, name: str) -> tuple[LLM, str]:
        """The embedding model `name` and the name it answers with."""
        if self._embedder is None:
            raise APIError(404, "no embedding model is loaded (start the server with "
                           "--embedding-model MODEL)", "not_found_error", "model",
                           "model_not_found")
        check_model(name, [self.settings.embedding_id])
        return self._embedder, self.settings.embedding_id


def check_model(name: str, ids: list[str]) -> None:
    if name not in ids:
        raise APIError(404, f"model {name!r} is not served here (serving: "
                       f"{', '.join(ids) or 'none'})", "not_found_error", "model",
                       "model_not_found")
