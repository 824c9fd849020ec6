"""Ollama's request bodies as hearth's: body validation, `keep_alive`, `options` as SamplingParams, messages and
tool calls as OpenAI's dicts, `think` as template variables, `format` as a constraint.  Every failure is an
APIError with a 400 and a one-line message (app/server/ollama.py turns it into Ollama's `{"error": ...}`).
The body's bytes are read as OpenAI's are (app/server/body.py: the same size limit); the validation is Ollama's.

Split out of app/server/ollama.py, which keeps the routes (the reply shapes: app/server/ollama_answers.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from typing import Any

from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from app.model_sampling import model_defaults
from app.model_sampling import pick as pick_values
from app.requests import ChatRequest, chat_request
from app.server.body import decode_body, read_body
from app.server.errors import APIError
from app.server.ollama_models import thinking_template
from app.server.ollama_schemas import DEFAULTS, ChatBody, OptionError, check_options, keep_alive_seconds
from app.server.response_format import JsonSchemaFormat, ResponseFormat, constraint_of
from backends.api import Backend, Request, SamplingParams
from backends.embeddings import is_embedding_model, not_for_chat
from backends.errors import HearthError, InvalidRequestError
from backends.tools.spec import ToolRequestError, tool_request_from_openai

log = logging.getLogger("hearth.server")


async def parse_body(request: HTTPRequest, schema: type[BaseModel], limit: int) -> Any:
    """The body as `schema`: read up to `limit` bytes as OpenAI's are (body.read_body), validated Ollama's way."""
    raw = await read_body(request, limit)
    return await run_in_threadpool(validate_body, raw, schema)


def validate_body(raw: bytes, schema: type[BaseModel]) -> Any:
    """Ollama's validation: every known field checked (a wrong type or range is a 400 naming it); fields Ollama's
    API does not have ignored, as Ollama ignores them, and named in a debug log line.  The body's size and depth
    are bounded before any of this (body.decode_body), ignored fields included."""
    data = decode_body(raw, 64, 4096 if schema is ChatBody else None)
    data = {k: v for k, v in data.items() if v is not None}
    unknown = sorted(k for k in data if k not in schema.model_fields)
    if unknown:
        log.debug("ignored fields Ollama's API does not have: %s", ", ".join(unknown[:20]))
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(("function-", "literal")))
        raise APIError(400, f"{loc or 'body'}: {first.get('msg')}") from None


def keep_alive_value(value: Any) -> float | None | bool:
    """A request's keep_alive in seconds (None: forever; False: not given); a 400 for one that is no duration."""
    if value is None:
        return False
    try:
        return keep_alive_seconds(value)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def check_options_only(raw: dict | None) -> None:
    try:
        check_options(raw)
    except OptionError as exc:
        raise APIError(400, exc.args[0]) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise APIError(400, f"options.{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg')}") from None


def refuse_embedding_model(backend: Backend) -> None:
    if is_embedding_model(backend.spec):
        raise APIError(400, not_for_chat(backend.spec))


def sampling_of(raw: dict | None, backend: Backend, name: str, logprobs: int | None = None) -> SamplingParams:
    """Ollama's options as SamplingParams (ollama_schemas.py: which are honoured, ignored, refused) for the model
    registered as `name`; `logprobs`: the body's (logprobs_of)."""
    try:
        opts, ignored = check_options(raw)
    except OptionError as exc:
        raise APIError(400, exc.args[0]) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise APIError(400, f"options.{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg')}") from None
    if ignored:
        log.debug("ignored options: %s", ", ".join(ignored[:20]))
    n_ctx = backend.n_ctx
    limit = min(opts.num_ctx, n_ctx) if opts.num_ctx is not None else n_ctx  # num_ctx above the load: the load's
    predict = opts.num_predict
    # -1 (Ollama's default): until a stop or the context is full; -2: fill the context.  The engines stop at
    # the context either way, so both are "at most the context"
    max_tokens = limit if predict is None or predict < 0 else max(min(predict, limit), 1)
    stop = (opts.stop,) if isinstance(opts.stop, str) else tuple(opts.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "options.stop: stop strings must not be empty")
    # each value: the request's option, else the model's defaults (Ollama's Modelfile parameters; here
    # app/model_sampling.py), else Ollama's default
    pick = pick_values({k: getattr(opts, k) for k in DEFAULTS}, model_defaults(backend.spec, name), DEFAULTS)
    try:
        return SamplingParams(
            temperature=float(pick["temperature"]),
            top_p=float(pick["top_p"]),
            top_k=int(pick["top_k"]),
            min_p=float(pick["min_p"]),
            repeat_penalty=float(pick["repeat_penalty"]),
            seed=opts.seed,
            max_tokens=max_tokens,
            stop=stop,
            presence_penalty=float(opts.presence_penalty or 0.0),
            frequency_penalty=float(opts.frequency_penalty or 0.0),
            logprobs=logprobs,
        )
    except InvalidRequestError as exc:
        raise APIError(400, f"options: {exc.one_line()}") from None


def logprobs_of(body: Any) -> int | None:
    """SamplingParams.logprobs for a chat or generate body: None unless `logprobs` is true, then `top_logprobs`
    (0 when not given).  `top_logprobs` alone asks for nothing, as on Ollama's server."""
    return (body.top_logprobs or 0) if body.logprobs else None


def tools_of(tools: list[dict] | None) -> Any:
    if not tools:
        return None
    try:
        return tool_request_from_openai(tools, "auto", None)
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line()) from None


def messages_of(messages: list[Any]) -> list[dict]:
    """Ollama's messages as hearth's (OpenAI's) dicts.  Ollama's tool calls carry no ids and its tool results
    answer calls in order (naming the function in tool_name), so ids are made here: call_<turn>_<k>, and each
    tool message answers the earliest unanswered call of the last assistant turn (the one named, when named)."""
    out: list[dict] = []
    pending: list[tuple[str, str]] = []  # (id, function name) of calls not answered yet
    for i, m in enumerate(messages):
        if m.images:
            raise APIError(400, f"messages[{i}].images: hearth serves text models (no vision)")
        item: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError(400, f"messages[{i}].tool_calls: only assistant messages make tool calls")
            calls = []
            pending = []
            for k, call in enumerate(m.tool_calls):
                given = getattr(call, "id", None)  # newer Ollama versions give calls ids: kept when sent back
                call_id = given if isinstance(given, str) and given else f"call_{i}_{k}"
                args = call.function.arguments
                text = args if isinstance(args, str) else json.dumps(args)
                calls.append(
                    {"id": call_id, "type": "function", "function": {"name": call.function.name, "arguments": text}}
                )
                pending.append((call_id, call.function.name))
            item["tool_calls"] = calls
        if m.role == "tool":
            name = m.tool_name or m.name
            match = next((p for p in pending if p[0] == m.tool_call_id), None) if m.tool_call_id else None
            match = match or next((p for p in pending if name is None or p[1] == name), None)
            if match is None:
                # a result with no call before it (clients that run tools themselves): give it an id of its own
                match = (f"call_{i}_result", name or "tool")
            else:
                pending.remove(match)
            item["tool_call_id"], item["name"] = match[0], match[1]
        out.append(item)
    return out


def think_vars(value: Any, backend: Backend) -> dict | None:
    """The template variables for Ollama's `think`, or None when not asked.  A model whose template has no
    thinking switch refuses think: true (as Ollama does); think: false asks for nothing there."""
    if value is None or value is False and not thinking_template(backend.spec):
        return None
    if not thinking_template(backend.spec):
        raise APIError(400, f"{backend.spec.name!r} does not support thinking (its chat template has no switch)")
    return {"enable_thinking": bool(value)} if value is not False else {"enable_thinking": False}


def build_request(
    backend: Backend, messages: list[dict], sampling: SamplingParams, tools: Any, think: dict | None
) -> ChatRequest:
    try:
        return chat_request(
            backend.spec, messages, sampling, request_id=new_request_id(), tools=tools, template_vars=think or None
        )
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line()) from None
    except HearthError as exc:  # a failing or over-budget template, a bad conversation
        raise APIError(400, exc.one_line()) from None


def with_format(req: Request, fmt: Any) -> Request:
    """Ollama's `format` ("json" or a JSON schema) through the response_format compile path."""
    if fmt is None or fmt == "":
        return req
    if fmt == "json":
        rf = ResponseFormat(type="json_object")
    else:
        rf = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name="format", schema=fmt))
    try:
        constraint = constraint_of(rf)
    except APIError as exc:
        raise APIError(400, exc.message.replace("response_format.json_schema.schema", "format")) from None
    return dataclasses.replace(req, constraint=constraint)


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"
