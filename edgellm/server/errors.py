"""Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with their
HTTP status: edgellm's typed exceptions and request validation mapped onto them. Anthropic's
routes (/v1/messages...) answer the same errors in Anthropic's shape (shaped)."""

from __future__ import annotations

import re

from ..errors import (
    ArgumentError,
    BusyError,
    ClosedError,
    ConstraintError,
    ContextError,
    EdgeLLMError,
    ModelKindError,
    SamplingError,
    TemplateError,
    TokenizerError,
)

# request fields an edgellm message may start with, as the API names them
_API_NAMES = {"repetition_penalty": "repeat_penalty", "prompt": "messages"}
_FIELD = re.compile(r"^(?:logit_bias\[|)([a-z_]+)\b")


class APIError(Exception):
    """An error response: status, message, type, param, code (and extra headers)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _param(message: str, known: set[str]) -> str | None:
    m = _FIELD.match(message)
    if m is None:
        return None
    name = _API_NAMES.get(m.group(1), m.group(1))
    if message.startswith("logit_bias"):
        return "logit_bias"
    return name if name in known else None


def from_edgellm(e: EdgeLLMError, fields: set[str]) -> APIError:
    """The response for an edgellm error raised while serving a request with `fields`."""
    msg = " ".join(str(e).split())
    if isinstance(e, (ClosedError, BusyError)):
        return APIError(503, msg, "server_error", code="unavailable",
                        headers={"Retry-After": "1"})
    if isinstance(e, ContextError):
        param = next((f for f in ("messages", "input") if f in fields), "prompt")
        return APIError(400, msg, param=param, code="context_length_exceeded")
    if isinstance(e, ConstraintError):  # the field its message starts with, else the one
        param = _param(msg, fields) or ("response_format" if "response_format" in fields
                                        else "tools" if "tools" in fields else None)
        return APIError(400, msg, param=param)
    if isinstance(e, TemplateError):
        return APIError(400, msg, param="messages")
    if isinstance(e, (ArgumentError, SamplingError, TokenizerError, ModelKindError)):
        return APIError(400, msg, param=_param(msg, fields))
    return APIError(500, msg, "server_error")


def from_validation(errors: list[dict]) -> APIError:
    """The response for pydantic's errors on a request body (the first one)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        where = first.get("ctx", {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON{': ' + where if where else ''}"
                        f" (at character {first['loc'][-1]})")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # union members add their type to the path (e.g. "str", "list[str]"): keep field names
    loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int")]
    param = ".".join(loc) or None
    text = first.get("msg", "invalid value")
    return APIError(400, f"{param + ': ' if param else ''}{text}", param=param)


# Anthropic's error types by HTTP status (its API reference, "Errors")
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                    529: "overloaded_error"}


def anthropic_body(e: APIError) -> dict:
    """`e` in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
    kind = _ANTHROPIC_TYPES.get(e.status, "api_error" if e.status >= 500
                                else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def shaped(e: APIError, path: str) -> dict:
    """`e`'s body in the shape of the API at `path`: Anthropic's for /v1/messages and
    below, OpenAI's elsewhere."""
    anthropic = path == "/v1/messages" or path.startswith("/v1/messages/")
    return anthropic_body(e) if anthropic else e.body()
