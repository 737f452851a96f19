"""Limits checked before a route runs: the API key (401) and the body size (413)."""

from __future__ import annotations

import hmac
import json

from starlette.exceptions import HTTPException

from .errors import APIError


class Limits:
    """ASGI middleware: request bodies of at most max_body bytes (413), and the API key
    on /v1/ routes (401), before a route reads anything."""

    def __init__(self, app, max_body: int, api_key: str | None = None):
        self.app, self.max_body, self.api_key = app, max_body, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope["path"].startswith("/v1/") \
                and scope["method"] != "OPTIONS":
            given = headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                return await _reply(send, APIError(
                    401, "missing or wrong API key (send Authorization: Bearer KEY)",
                    "authentication_error", code="invalid_api_key"))
        length = headers.get("content-length")
        too_big = APIError(413, f"request body is larger than {self.max_body} bytes",
                           param=None, code="request_too_large")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _drain(receive, DRAIN_LIMIT)
            return await _reply(send, too_big)
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    if message.get("more_body", False):
                        await _drain(receive, DRAIN_LIMIT)
                    raise BodyTooLarge(too_big)
            return message

        try:
            await self.app(scope, bounded, send)
        except BodyTooLarge:  # raised where the app did not answer it itself
            await _reply(send, too_big)


class BodyTooLarge(HTTPException):
    """A body without Content-Length found larger than the limit while read. An HTTP
    exception, so that FastAPI, reading the body, passes it on (any other exception there
    becomes its 400 "error parsing the body") to the app's handler, which answers 413 with
    `error` (app.py)."""

    def __init__(self, error: APIError):
        super().__init__(413, error.message)
        self.error = error


DRAIN_LIMIT = 64 << 20  # bytes of a refused body read (and dropped) so the client sees 413


async def _drain(receive, limit: int) -> None:
    """Read and drop what is left of a refused body (up to `limit` bytes): a client still
    sending would otherwise see a broken connection instead of the 413."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


async def _reply(send, e: APIError) -> None:
    body = json.dumps(e.body()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
