"""Request bodies, as OpenAI's API reference shapes them (pydantic models).

Fields OpenAI defines that edgellm does not act on (user, store, metadata, service_tier...)
are accepted and ignored, as OpenAI's clients send some of them; a field edgellm cannot
honour (n > 1, logprobs) is refused with 400 naming it. Values are range-checked here
only where the API has its own bounds (n, messages); everything edgellm itself checks
(sampling ranges, tools, response_format, token ids) is checked by edgellm.arguments /
sampling / constraints, whose typed errors become 400s (errors.py). An optional field may
be null, as OpenAI's reference allows and some clients send: null is its default.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = False


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class Sampling(_Body):
    """The sampling fields both generating endpoints take (llama.cpp's extras included)."""

    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool | None = False  # llama.cpp's: run to max_tokens
    stop: str | list[str] | None = None
    n: int | None = Field(default=1, ge=1, le=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: Literal[False] | None = None  # not computed: true is refused
    # vLLM's: keep only the prompt's last N tokens (-1: as many as the server takes);
    # without it a prompt beyond the server's limit is refused (limits.fit_prompt)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class ChatCompletionRequest(Sampling):
    model: str
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    response_format: dict[str, Any] | None = None
    top_logprobs: None = None


class CompletionRequest(Sampling):
    model: str
    prompt: str | list[str] | list[int]
    echo: Literal[False] | None = False
    suffix: None = None
    best_of: int | None = Field(default=None, ge=1, le=1)


class EmbeddingRequest(_Body):
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
