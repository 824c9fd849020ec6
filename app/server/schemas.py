"""Request bodies of the OpenAI API subset hearth serves, validated with pydantic (strict types: a string where
a number belongs is a 400, not a silent cast).  Responses are plain dicts built in app/server/app.py.

Nothing is silently ignored: a field these models do not declare is refused with a 400 that names it
(`extra="forbid"`; app.py words the message, saying whether OpenAI documents the field).  A field sent as
null asks for nothing and is dropped before validation.  Documented extensions, as vLLM and llama.cpp's
server take them: top_k, min_p, repeat_penalty, ignore_eos, priority.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from app.server.response_format import ResponseFormat
from app.server.tool_schemas import NamedToolChoice, Tool, ToolCall
from backends.api import MAX_TOP_LOGPROBS, PRIORITY_MAX, PRIORITY_MIN

MAX_CHOICES = 16  # n: choices per request (each is a generation: n x max_tokens bounds the work)

# Fields of OpenAI's chat and completions request bodies (platform.openai.com API reference, December 2026),
# so that a refusal can say "OpenAI's field X is not supported" rather than "unknown field X"
OPENAI_FIELDS = frozenset(
    {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
        "prompt",
        "best_of",
        "echo",
        "suffix",  # completions
    }
)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr | None = None  # null only for an assistant message that makes tool calls
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: StrictStr | None = None  # tool: the call it answers
    name: StrictStr | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only in an assistant message with tool_calls)")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id (the id of the call it answers)")
        return self

    def as_dict(self) -> dict:
        """The message for the request builder: content text ("" for null), tool fields where set."""
        out: dict = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False  # send a last chunk with usage (and empty choices)


Number = StrictFloat | StrictInt


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 400 naming it, never ignored
    model: StrictStr
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    max_tokens: StrictInt | None = None  # checked against the context in the route (1..n_ctx)
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    n: StrictInt = Field(default=1, ge=1, le=MAX_CHOICES)  # choices; seeds seed, seed + 1, ... when given
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None  # text | json_object | json_schema (app/server/response_format.py)
    presence_penalty: Number = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: Number = Field(default=0.0, ge=-2, le=2)
    logit_bias: dict[StrictStr, Number] | None = None  # {"token id": bias in -100..100}; checked in the route
    user: StrictStr | None = None  # an end-user id for the caller's own records: changes nothing here
    # extensions (vLLM's / llama.cpp server's): off unless given
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: Number | None = Field(default=None, ge=0, le=1)
    repeat_penalty: Number | None = Field(default=None, gt=0)
    ignore_eos: StrictBool = False  # generate exactly max_tokens (benchmarks)
    # vLLM's: lower runs first, default 0 (the chat app and `hearth run` take -1); the torch engine admits and
    # preempts by it, llama.cpp orders its queue by it (backends/priority.py)
    priority: StrictInt | None = Field(default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # the newer name for max_tokens
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    logprobs: StrictBool = False  # each generated token's log-probability
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs: true


class CompletionRequest(_Common):
    # one prompt: a string, or token ids as OpenAI's API allows (lists of prompts are not served: use n)
    prompt: StrictStr | list[StrictInt] = Field(min_length=1)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # the k most likely per token
    echo: StrictBool = False  # the prompt before the completion (with its logprobs when logprobs is set)
