"""Request bodies of the OpenAI API subset hearth serves, validated with pydantic (strict types: a string where
a number belongs is a 400, not a silent cast).  Responses are plain dicts built in app/server/routes.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from app.server.response_format import ResponseFormat


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]  # "tool" messages need tool calls, which hearth does not serve
    content: StrictStr


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


class CompletionRequest(_Common):
    # one prompt: a string, or token ids as OpenAI's API allows (lists of prompts would need n > 1 replies)
    prompt: StrictStr | list[StrictInt] = Field(min_length=1)
