"""From an HTTP body to backend Requests: parsing and validation (a 400 naming the field), the sampling an
OpenAI request asks for, its tools, response_format and prompt.  Everything here runs before a slot is taken."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TypeVar

from fastapi import Request as HTTPRequest
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from app.model_sampling import model_defaults
from app.model_sampling import pick as pick_values
from app.requests import ChatRequest, chat_request
from app.server.body import decode_body, read_body
from app.server.config import ServerConfig
from app.server.errors import APIError
from app.server.response_format import constraint_of
from app.server.schemas import OPENAI_FIELDS, ChatCompletionRequest, CompletionRequest
from backends.api import MAX_LOGIT_BIAS, Backend, Request, SamplingParams
from backends.constrained import check_constraint
from backends.errors import HearthError, InvalidRequestError
from backends.tools.spec import ToolRequest, ToolRequestError, tool_request_from_openai

Body = ChatCompletionRequest | CompletionRequest
_B = TypeVar("_B", ChatCompletionRequest, CompletionRequest)

_UNION_TAGS = {"float", "int", "str", "bool", "list"}


def unknown_model(name: str, served: str) -> APIError:
    return APIError(
        404, f"model {name!r} is not served here; this server serves {served!r}", param="model", code="model_not_found"
    )


async def parse(request: HTTPRequest, schema: type[_B], config: ServerConfig) -> _B:
    """The body as `schema`: read up to the size limit (body.read_body), then validated OpenAI's way."""
    raw = await read_body(request, config.limits.max_body_bytes)
    # decoding a 1 MiB body, walking it and validating thousands of messages is CPU work: off the event loop
    return await run_in_threadpool(_validate, raw, schema, config)


def _validate(raw: bytes, schema: type[_B], config: ServerConfig) -> _B:
    data = decode_body(raw, config.max_json_depth, config.max_messages if schema is ChatCompletionRequest else None)
    data = {k: v for k, v in data.items() if v is not None}  # null asks for nothing: the default
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first.get("type") == "extra_forbidden":  # a field hearth does not serve: named, never ignored
            name = ".".join(str(p) for p in first.get("loc", ()))
            what = "OpenAI's field" if name in OPENAI_FIELDS else "unknown field"
            raise APIError(
                400,
                f"{what} {name!r} is not supported by this server (hearth refuses what it would otherwise ignore)",
                param=name,
                code="unsupported_parameter",
            ) from None
        # union members add their type to the location ("temperature.float"): drop those tags
        loc = [str(p) for p in first.get("loc", ()) if str(p) not in _UNION_TAGS and "[" not in str(p)]
        param = ".".join(loc) or None
        raise APIError(400, f"{param or 'body'}: {first.get('msg')}", param=param) from None
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return body


def tools_of(body: ChatCompletionRequest) -> ToolRequest | None:
    """The request's tools, tool_choice and parallel_tool_calls, checked (a 400 naming the field)."""
    if body.tools is None and body.tool_choice is None:
        return None
    tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    try:
        return tool_request_from_openai(tools, choice, body.parallel_tool_calls)
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line(), param=exc.param) from None


def build_chat_request(
    backend: Backend, messages: list[dict], sampling: SamplingParams, tools: ToolRequest | None = None
) -> ChatRequest:
    """The one request builder (app/requests.py), as `hearth run` and the TUI use it."""
    try:
        built = chat_request(backend.spec, messages, sampling, request_id=_request_id(), tools=tools)
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line(), param=exc.param) from None
    except HearthError as exc:  # TemplateError (a failing or over-budget template), InvalidRequestError
        raise APIError(400, exc.one_line(), param="messages", code="template_error") from None
    if built.request.constraint is not None:  # a forced call: its schema is the tools' own, checked like any
        try:
            check_constraint(built.request.constraint)
        except InvalidRequestError as exc:
            raise APIError(400, f"tools: {exc.one_line()}", param="tools") from None
    return built


def completion_request(body: CompletionRequest, sampling: SamplingParams, backend: Backend) -> Request:
    """/v1/completions: the prompt as text (tokenized with BOS as the model asks), or token ids (sent to the
    model as they are: no BOS is added)."""
    prompt = body.prompt
    if isinstance(prompt, list):
        vocab = backend.spec.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        return Request(prompt_token_ids=tuple(prompt), sampling=sampling, request_id=_request_id())
    return Request(prompt=prompt, sampling=sampling, request_id=_request_id())


def constrained(req: Request, body: Body) -> Request:
    """The request with the Constraint its response_format asks for (checked here: a 400 naming the field)."""
    constraint = constraint_of(body.response_format)
    if constraint is not None and req.constraint is not None:  # a forced tool_choice constrains it already
        raise APIError(
            400,
            "response_format and a forced tool_choice both constrain the reply; send one of them",
            param="response_format",
        )
    return req if constraint is None else dataclasses.replace(req, constraint=constraint)


def prioritised(req: Request, body: Body) -> Request:
    """The request with the body's `priority` (vLLM's: lower runs first; the API's default 0 ranks behind the
    chat app's and `hearth run`'s own requests, which take INTERACTIVE_PRIORITY)."""
    return req if body.priority is None else dataclasses.replace(req, priority=body.priority)


def _request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def sampling_of(
    body: Body, max_tokens: int | None, backend: Backend, config: ServerConfig, name: str | None = None
) -> SamplingParams:
    """What the OpenAI request asks for, with OpenAI's semantics: each of temperature, top_p, top_k, min_p and
    repeat_penalty as given, else the model's defaults (app/model_sampling.py: the user's own for it over its
    recommendation, as vLLM applies generation_config.json), else OpenAI's defaults (temperature and top_p 1, no
    top_k/min_p truncation, no penalty; hearth's own defaults are for `hearth run` and the chat app).  `name`:
    the model's registered name (the served one by default)."""
    n_ctx = backend.n_ctx
    if max_tokens is not None and not 1 <= max_tokens <= n_ctx:
        raise APIError(
            400, f"max_tokens must be between 1 and the context length {n_ctx}, got {max_tokens}", param="max_tokens"
        )
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "stop strings must not be empty", param="stop")
    if isinstance(body, ChatCompletionRequest):
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        prompt_logprobs = False
    else:  # completions: logprobs=k; echo + logprobs also scores the prompt
        logprobs, prompt_logprobs = body.logprobs, body.echo and body.logprobs is not None
    given = {name: getattr(body, name, None) for name in OPENAI_DEFAULTS}
    pick = pick_values(given, model_defaults(backend.spec, name or config.model_name), OPENAI_DEFAULTS)
    return SamplingParams(
        temperature=float(pick["temperature"]),
        top_p=float(pick["top_p"]),
        top_k=int(pick["top_k"]),
        min_p=float(pick["min_p"]),
        repeat_penalty=float(pick["repeat_penalty"]),
        seed=body.seed,
        max_tokens=max_tokens if max_tokens is not None else min(config.default_max_tokens, n_ctx),
        stop=stop,
        ignore_eos=body.ignore_eos,
        presence_penalty=float(body.presence_penalty),
        frequency_penalty=float(body.frequency_penalty),
        logit_bias=_logit_bias(body.logit_bias, backend),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}


def _logit_bias(given: dict | None, backend: Backend) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"token id": bias}, keys are strings in JSON) as (id, bias) pairs, checked."""
    if not given:
        return ()
    if len(given) > MAX_LOGIT_BIAS:
        raise APIError(
            400, f"logit_bias has {len(given)} entries; at most {MAX_LOGIT_BIAS} are allowed", param="logit_bias"
        )
    vocab = backend.spec.vocab_size
    out = []
    for key, bias in given.items():
        if not (key.isascii() and key.isdigit()):
            raise APIError(400, f"logit_bias keys are token ids (decimal strings), got {key!r}", param="logit_bias")
        token = int(key)
        if vocab > 0 and token >= vocab:
            raise APIError(
                400, f"logit_bias token id {token} is outside the vocabulary (0..{vocab - 1})", param="logit_bias"
            )
        if not -100 <= bias <= 100:
            raise APIError(
                400, f"logit_bias values are in [-100, 100], got {bias} for token {token}", param="logit_bias"
            )
        out.append((token, float(bias)))
    return tuple(sorted(out))
