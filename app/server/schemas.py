"""Request bodies of the OpenAI API subset hearth serves, validated with pydantic (strict types: a string where
a number belongs is a 400, not a silent cast).  Responses are plain dicts built in app/server/routes.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from app.server.response_format import ResponseFormat
from app.server.tool_schemas import NamedToolChoice, Tool, ToolCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr | None = None  # null only for an assistant message that makes tool calls
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: StrictStr | None = None  # tool: the call it answers
    name: StrictStr | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> "ChatMessage":
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
    include_usage: StrictBool = False  # send a last chunk with usage (and empty choices)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI fields (user, logit_bias ...) are ignored
    model: StrictStr
    temperature: StrictFloat | StrictInt | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | StrictInt | None = Field(default=None, gt=0, le=1)
    max_tokens: StrictInt | None = None  # checked against the context in the route (1..n_ctx)
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    n: StrictInt = 1  # only 1 is served
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False  # vLLM's extension: generate exactly max_tokens (benchmarks)
    response_format: ResponseFormat | None = None  # text | json_object | json_schema (app/server/response_format.py)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # the newer name for max_tokens
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None


class CompletionRequest(_Common):
    # one prompt: a string, or token ids as OpenAI's API allows (lists of prompts would need n > 1 replies)
    prompt: StrictStr | list[StrictInt] = Field(min_length=1)
