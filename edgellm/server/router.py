"""Leases: the model a request names loaded before its route runs, and kept loaded until
its response (a stream included) has ended.

ASGI middleware inside Limits (which bounds the body first): a POST body that is a JSON
object with a `model` the server serves takes a lease on it (models.Served.lease: loading
it, and closing idle models for room, while the request waits); the body is then handed
to the route as it came. Anything else (no such field, another model name, a body that is
not JSON) goes through untouched, for the route to answer in its API's shape.
"""

from __future__ import annotations

import json

from .errors import APIError
from .limits import _reply
from .models import Served


class Leases:
    def __init__(self, app, served: Served):
        self.app, self.served = app, served

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not self.served.routing:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # a disconnect, later

        name = _model_of(body)
        if name is None or name not in self.served.models:
            return await self.app(scope, replay, send)
        try:
            lease = self.served.lease(name)
            await lease.__aenter__()
        except APIError as e:
            return await _reply(send, e)
        try:
            await self.app(scope, replay, send)
        finally:
            await lease.__aexit__(None, None, None)


def _model_of(body: bytes) -> str | None:
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None
