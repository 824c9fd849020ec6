"""The FastAPI app: routes of the OpenAI API subset, auth, body limits, error bodies, metrics.

Bodies are parsed by hand (size check, JSON, nesting, Unicode, message count, pydantic; see body.py) so that
every bad input gets an OpenAI-style error body and a 4xx.  A request's cost is bounded by its size: decoding
and the chat template run on worker threads (the template itself in its budgeted process), never on the event
loop, so /health and SIGTERM always answer; a client that disconnects, streaming or not, aborts its request.
With an API key, every path but /health needs `Authorization: Bearer KEY` (/health stays open so a supervisor
can probe liveness without the key; it reveals nothing but "ok" and the model name); the key is compared as
UTF-8 bytes, so non-ASCII keys work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from app.defaults import SAMPLING
from app.requests import ChatRequest, chat_request
from app.server.errors import APIError
from app.server.metrics import ServerMetrics
from app.server.runner import Generation, Limits, Runner
from app.server.body import decode_body
from app.server.schemas import ChatCompletionRequest, CompletionRequest
from app.server.tool_replies import ToolReply
from backends.api import Backend, EventKind, Request, SamplingParams
from backends.errors import HearthError, InvalidRequestError
from backends.tools.render import ToolReading
from backends.tools.spec import ToolRequest, ToolRequestError, tool_request_from_openai


@dataclass
class ServerConfig:
    model_name: str  # the id /v1/models lists; requests must name it
    api_key: str | None = None  # Bearer key required on every path but /health; None = open
    limits: Limits = field(default_factory=Limits)
    default_max_tokens: int = SAMPLING.max_tokens  # when a request gives none (bounded by the context)
    system_prompt: str | None = None  # not injected: OpenAI clients send their own system message
    max_messages: int = 4096  # messages in one chat request (render and tokenize cost grows with them)
    max_json_depth: int = 64  # nesting of arrays/objects in a body (OpenAI bodies nest well under 20)


class _Guard:
    """Pure ASGI middleware (streams and disconnects pass through untouched): API key, Content-Length limit,
    and the requests-by-status counter."""

    def __init__(self, app: Any, config: ServerConfig, metrics: ServerMetrics) -> None:
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        raw = {k.lower(): v for k, v in scope.get("headers", [])}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw.items()}
        error = None
        if self.config.api_key and path != "/health":
            # bytes against bytes: a key with non-ASCII characters is compared as the UTF-8 that clients send
            given = raw.get(b"authorization", b"")
            expected = f"Bearer {self.config.api_key}".encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                error = APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                 type="authentication_error", code="invalid_api_key")
        if error is None and headers.get("content-length", "").isdigit():
            if int(headers["content-length"]) > self.config.limits.max_body_bytes:
                error = _too_large(self.config.limits.max_body_bytes)
        status_seen: list[int] = []

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        label = path if path in _KNOWN_PATHS else "other"
        try:
            if error is not None:
                await _json_error(error)(scope, receive, counting_send)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(label, str(status_seen[0] if status_seen else 499)).inc()


_KNOWN_PATHS = {"/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/metrics"}


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", code="body_too_large")


def _json_error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def create_app(backend: Backend, config: ServerConfig) -> FastAPI:
    """An app serving `backend` (already loaded).  The caller owns the backend and closes it."""
    metrics = ServerMetrics()
    runner = Runner(backend, config.limits, metrics)
    app = FastAPI(title="hearth", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runner = runner
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
        return _json_error(exc)

    @app.exception_handler(InvalidRequestError)
    async def _invalid_request(_: HTTPRequest, exc: InvalidRequestError) -> JSONResponse:
        return _json_error(APIError(400, str(exc)))  # SamplingParams refused a value (e.g. a seed beyond 64 bits)

    @app.exception_handler(404)
    async def _not_found(request: HTTPRequest, _: Exception) -> JSONResponse:
        return _json_error(APIError(404, f"no such endpoint: {request.url.path}", code="not_found"))

    @app.exception_handler(405)
    async def _bad_method(request: HTTPRequest, _: Exception) -> JSONResponse:
        return _json_error(APIError(405, f"{request.method} is not allowed on {request.url.path}"))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": config.model_name}

    @app.get("/metrics")
    async def prom() -> Response:
        return Response(metrics.render(backend.stats()), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(config.model_name)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict:
        if name != config.model_name:
            raise _unknown_model(name, config.model_name)
        return _model_card(name)

    @app.post("/v1/chat/completions")
    async def chat(request: HTTPRequest) -> Response:
        body = await _parse(request, ChatCompletionRequest, config)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = _sampling(body, max_tokens, backend, config)
        tools = _tools(body)
        # the template runs in its own budgeted process; this thread only waits for it
        built = await run_in_threadpool(_chat_request, backend, [m.as_dict() for m in body.messages], sampling,
                                        tools)
        req = await run_in_threadpool(_constrained, built.request, body)
        return await _respond(request, runner, req, body, chat=True, model_name=config.model_name,
                              tools=built.tools)

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest) -> Response:
        body = await _parse(request, CompletionRequest, config)
        req = _completion_request(body, _sampling(body, body.max_tokens, backend, config), backend)
        req = await run_in_threadpool(_constrained, req, body)
        return await _respond(request, runner, req, body, chat=False, model_name=config.model_name)

    app.add_middleware(_Guard, config=config, metrics=metrics)
    return app


_UNION_TAGS = {"float", "int", "str", "bool", "list"}


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hearth"}


def _unknown_model(name: str, served: str) -> APIError:
    return APIError(404, f"model {name!r} is not served here; this server serves {served!r}", param="model",
                    code="model_not_found")


async def _parse(request: HTTPRequest, schema: type[BaseModel], config: ServerConfig) -> Any:
    limit = config.limits.max_body_bytes
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    # decoding a 1 MiB body, walking it and validating thousands of messages is CPU work: off the event loop
    return await run_in_threadpool(_validate, b"".join(chunks), schema, config)


def _validate(raw: bytes, schema: type[BaseModel], config: ServerConfig) -> Any:
    data = decode_body(raw, config.max_json_depth, config.max_messages if schema is ChatCompletionRequest else None)
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        # union members add their type to the location ("temperature.float"): drop those tags
        loc = [str(p) for p in first.get("loc", ()) if str(p) not in _UNION_TAGS and "[" not in str(p)]
        param = ".".join(loc) or None
        raise APIError(400, f"{param or 'body'}: {first.get('msg')}", param=param) from None
    if body.model != config.model_name:
        raise _unknown_model(body.model, config.model_name)
    if body.n != 1:
        raise APIError(400, f"n must be 1 (one reply per request), got {body.n}", param="n")
    return body


def _tools(body: Any) -> ToolRequest | None:
    """The request's tools, tool_choice and parallel_tool_calls, checked (a 400 naming the field)."""
    if body.tools is None and body.tool_choice is None:
        return None
    tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    try:
        return tool_request_from_openai(tools, choice, body.parallel_tool_calls)
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line(), param=exc.param) from None


def _chat_request(backend: Backend, messages: list[dict], sampling: SamplingParams,
                  tools: ToolRequest | None = None) -> ChatRequest:
    """The one request builder (app/requests.py), as `hearth run` and the TUI use it."""
    try:
        built = chat_request(backend.spec, messages, sampling, request_id=_request_id(), tools=tools)
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line(), param=exc.param) from None
    except HearthError as exc:  # TemplateError (a failing or over-budget template), InvalidRequestError
        raise APIError(400, exc.one_line(), param="messages", code="template_error") from None
    if built.request.constraint is not None:  # a forced call: its schema is the tools' own, checked like any
        from backends.constrained import check_constraint

        try:
            check_constraint(built.request.constraint)
        except InvalidRequestError as exc:
            raise APIError(400, f"tools: {exc.one_line()}", param="tools") from None
    return built


def _completion_request(body: Any, sampling: SamplingParams, backend: Backend) -> Request:
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


def _constrained(req: Request, body: Any) -> Request:
    """The request with the Constraint its response_format asks for (checked here: a 400 naming the field)."""
    from app.server.response_format import constraint_of

    constraint = constraint_of(body.response_format)
    if constraint is not None and req.constraint is not None:  # a forced tool_choice constrains it already
        raise APIError(400, "response_format and a forced tool_choice both constrain the reply; send one of them",
                       param="response_format")
    return req if constraint is None else dataclasses.replace(req, constraint=constraint)


def _request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def _sampling(body: Any, max_tokens: int | None, backend: Backend, config: ServerConfig) -> SamplingParams:
    """What the OpenAI request asks for, with OpenAI's semantics: temperature/top_p as given (defaults 1), no
    top_k/min_p truncation the client did not ask for (hearth's own defaults are for `hearth run` and the TUI)."""
    n_ctx = backend.n_ctx
    if max_tokens is not None and not 1 <= max_tokens <= n_ctx:
        raise APIError(400, f"max_tokens must be between 1 and the context length {n_ctx}, got {max_tokens}",
                       param="max_tokens")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "stop strings must not be empty", param="stop")
    return SamplingParams(
        temperature=float(body.temperature) if body.temperature is not None else 1.0,
        top_p=float(body.top_p) if body.top_p is not None else 1.0, top_k=0, min_p=0.0, seed=body.seed,
        max_tokens=max_tokens if max_tokens is not None else min(config.default_max_tokens, n_ctx),
        stop=stop, ignore_eos=body.ignore_eos)


def _usage(gen: Generation) -> dict:
    stats = gen.finished.stats if gen.finished and gen.finished.stats else gen.started.stats
    p = stats.prompt_tokens if stats else 0
    c = stats.completion_tokens if stats else 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish(gen: Generation) -> str:
    reason = gen.finished.finish_reason.value if gen.finished else "abort"
    return reason if reason in ("stop", "length") else "stop"


_T = TypeVar("_T")


class _ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


async def _wait_disconnect(request: HTTPRequest) -> None:
    # The body is read already, so the next ASGI message can only be http.disconnect (uvicorn holds it back
    # until the client goes away or the response is complete).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: HTTPRequest, work: Awaitable[_T]) -> _T:
    """`work`, or _ClientGone once the client disconnects first: `work` is then cancelled, and cancelling a
    Generation (Runner.open, Generation.events) aborts its backend request and frees its slot."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise _ClientGone
    return task.result()


async def _respond(request: HTTPRequest, runner: Runner, req: Request, body: Any, *, chat: bool,
                   model_name: str, tools: ToolReading | None = None) -> Response:
    try:
        return await _unless_gone(request, _answer(runner, req, body, chat=chat, model_name=model_name,
                                                   tools=tools))
    except _ClientGone:
        return Response(status_code=499)  # nobody reads it; the metrics count it as "client closed request"


async def _answer(runner: Runner, req: Request, body: Any, *, chat: bool, model_name: str,
                  tools: ToolReading | None = None) -> Response:
    """Waits for a slot and, unless streaming, for the whole reply: both end early when the client leaves.
    With tools, the reply's calls are parsed out of its text (app/server/tool_replies.py)."""
    reply = ToolReply(tools) if tools is not None else None
    gen = await runner.open(req)
    created = int(time.time())
    rid = ("chatcmpl-" if chat else "cmpl-") + req.request_id[4:]
    obj = "chat.completion" if chat else "text_completion"
    if not body.stream:
        parts = []
        async for event in gen.events():
            if event.kind is EventKind.TOKEN:
                parts.append(event.text)
        if gen.finished and gen.finished.finish_reason.value == "error":
            raise APIError(500, f"generation failed: {gen.finished.error}", type="server_error",
                           code=gen.finished.error_code)
        text = "".join(parts)
        choice: dict = {"index": 0, "finish_reason": _finish(gen), "logprobs": None}
        if reply is not None:
            choice["message"] = reply.message(text)
            choice["finish_reason"] = reply.finish_reason(choice["finish_reason"])
        elif chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": model_name,
                             "choices": [choice], "usage": _usage(gen)})
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def sse(choices: list, usage: dict | None = None) -> bytes:
        payload: dict = {"id": rid, "object": chunk_obj, "created": created, "model": model_name,
                         "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n".encode()

    def choice(text: str | None, finish: str | None, first: bool = False) -> dict:
        if chat:
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

    def pieces(text: str, final: bool = False) -> list[bytes]:
        if reply is None:
            return [sse([choice(text, None)])] if text else []
        deltas = reply.feed(text) + (reply.finish() if final else [])
        return [sse([{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}]) for d in deltas]

    async def stream():
        try:
            if chat:
                yield sse([choice(None, None, first=True)])
            async for event in gen.events():
                if event.kind is EventKind.TOKEN and event.text:
                    for chunk in pieces(event.text):
                        yield chunk
                elif event.kind is EventKind.FINISHED:
                    for chunk in pieces("", final=True):
                        yield chunk
                    if event.finish_reason.value == "error":
                        err = APIError(500, f"generation failed: {event.error}", type="server_error",
                                       code=event.error_code)
                        yield f"data: {json.dumps(err.body())}\n\n".encode()
                    finish = _finish(gen)
                    yield sse([choice(None, reply.finish_reason(finish) if reply is not None else finish)])
            if include_usage:
                yield sse([], _usage(gen))
            yield b"data: [DONE]\n\n"
        finally:
            if gen.finished is None:
                gen.abort()

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
