"""Limits: the API key (401) and the body size (413), checked before a route runs; a
prompt's tokens (fit_prompt: 400 context_length_exceeded), once the route has them. Errors
are in the shape of the API the path belongs to (errors.shaped)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json

from starlette.exceptions import HTTPException

from .errors import APIError, shaped


class Limits:
    """ASGI middleware: request bodies of at most max_body bytes (413; `larger` maps a path
    to its own bound: an audio upload's), and the API key on /v1/ routes (401:
    `Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY`), before a route reads
    anything."""

    def __init__(self, app, max_body: int, api_key: str | None = None,
                 larger: dict[str, int] | None = None):
        self.app, self.max_body, self.api_key = app, max_body, api_key
        self.larger = larger or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        path = scope["path"]
        if self.api_key is not None and path.startswith("/v1/") \
                and scope["method"] != "OPTIONS":
            given = headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            token = token or headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                return await _reply(send, APIError(
                    401, "missing or wrong API key (send Authorization: Bearer KEY, or "
                    "x-api-key: KEY)", "authentication_error", code="invalid_api_key"), path)
        length = headers.get("content-length")
        limit = self.larger.get(path, self.max_body)
        too_big = APIError(413, f"request body is larger than {limit} bytes",
                           param=None, code="request_too_large")
        if length is not None and (not length.isdigit() or int(length) > limit):
            # a client waiting for 100 Continue sends no body: nothing to read
            return await _refuse(receive, send, too_big,
                                 headers.get("expect", "").lower() != "100-continue", path)
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if message.get("more_body", False):
                        await _drain(receive, DRAIN_LIMIT)
                    raise BodyTooLarge(too_big)
            return message

        try:
            await self.app(scope, bounded, send)
        except BodyTooLarge:  # raised where the app did not answer it itself
            await _reply(send, too_big, path)


def token_bytes(tokenizer) -> int:
    """The most bytes of text one token stands for, at most: the longest token's UTF-8
    length (a byte-level token's characters are two bytes for one, a byte-fallback token
    six: never fewer than the text they stand for)."""
    return max(len((tokenizer.id_to_token(i) or "").encode("utf-8", "replace"))
               for i in range(tokenizer.vocab_size)) or 1


def refuse_early(nbytes: int, per_token: int, context: int, limit: int,
                 what: str = "") -> None:
    """A prompt whose text alone (`nbytes` UTF-8 bytes) takes more than `limit` tokens,
    `per_token` bytes a token at most, refused before it is rendered and tokenized: a
    750 KB message held the interpreter's lock for a second in the tokenizer, every other
    request waiting."""
    at_least = -(-nbytes // per_token)
    if at_least > limit:
        _too_long(f"at least {at_least}", context, limit, what)


def fit_prompt(ids: list[int], context: int, limit: int, truncate: int | None,
               what: str = "") -> list[int]:
    """The prompt `ids` the server runs: its last `truncate` tokens when asked (-1: `limit`),
    else all of it; refused (400, OpenAI's context_length_exceeded) when beyond `limit`
    tokens (at most context - 1: room for the answer's first token). `what`: what the count
    includes, for the message. Never prefilled through context shifts: that took minutes
    for a 750 KB message, every later request waiting."""
    if truncate is not None:
        if truncate == 0:
            raise APIError(400, "truncate_prompt_tokens must be -1 (as many as fit) or at "
                           "least 1", param="truncate_prompt_tokens")
        ids = ids[-(limit if truncate == -1 else truncate):]
    if len(ids) > limit:
        _too_long(str(len(ids)), context, limit, what)
    return ids


def _too_long(n: str, context: int, limit: int, what: str):
    param = "messages" if what else "prompt"
    if limit >= context - 1:
        msg = (f"this model's maximum context length is {context} tokens, but the prompt is "
               f"{n} tokens{what}")
    else:
        msg = (f"the prompt is {n} tokens{what}: this server takes at most {limit} "
               "(--max-prompt-tokens)")
    raise APIError(400, msg + "; shorten it, or send truncate_prompt_tokens=N to keep its "
                   "last N tokens", param=param, code="context_length_exceeded")


class BodyTooLarge(HTTPException):
    """A body without Content-Length found larger than the limit while read. An HTTP
    exception, so that FastAPI, reading the body, passes it on (any other exception there
    becomes its 400 "error parsing the body") to the app's handler, which answers 413 with
    `error` (app.py)."""

    def __init__(self, error: APIError):
        super().__init__(413, error.message)
        self.error = error


DRAIN_LIMIT = 64 << 20  # bytes of a refused body read (and dropped) so the client sees 413
DRAIN_S = 10.0  # and the most time spent reading them


async def _refuse(receive, send, e: APIError, drain: bool, path: str) -> None:
    """`e` (a 413) sent whole at once, before the body is read (the client waiting for its
    answer has it at once); then, with `drain`, what the client still sends of its body read
    and dropped (bounded) before the response is completed: the connection is closed then,
    and one closed on unread data is reset, a client still sending seeing the reset (a
    broken pipe), not the 413."""
    body = json.dumps(shaped(e, path)).encode()
    await send({"type": "http.response.start", "status": e.status, "headers": _headers(e, body)})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    if drain:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_drain(receive, DRAIN_LIMIT), DRAIN_S)
    await send({"type": "http.response.body", "body": b""})


async def _drain(receive, limit: int) -> None:
    """Read and drop what is left of a refused body (up to `limit` bytes): a client still
    sending would otherwise see a broken connection instead of the 413."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


def _headers(e: APIError, body: bytes) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    return headers + [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]


async def _reply(send, e: APIError, path: str) -> None:
    body = json.dumps(shaped(e, path)).encode()
    await send({"type": "http.response.start", "status": e.status, "headers": _headers(e, body)})
    await send({"type": "http.response.body", "body": body})
