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

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from app.defaults import SAMPLING
from app.requests import ChatRequest, chat_request
from app.server.body import decode_body
from app.server.choices import Choices, choice_requests
from app.server.embeddings import EmbeddingRequest, openai_embeddings
from app.server.errors import APIError
from app.server.keep_alive import STATUS_PATHS, KeepAlive
from app.server.logprobs import CompletionLogprobs, chat_logprobs
from app.server.metrics import ServerMetrics
from app.server.ollama import add_ollama_routes, ollama_error
from app.server.ollama_models import Catalog
from app.server.response_format import constraint_of, constraint_param, limit_error, named
from app.server.runner import Generation, Limits, Runner
from app.server.schemas import OPENAI_FIELDS, ChatCompletionRequest, CompletionRequest
from app.server.tool_replies import ToolReply
from backends.api import MAX_LOGIT_BIAS, Backend, EventKind, Request, SamplingParams
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
    # the registered models Ollama's /api/tags and /api/show list (app/server/ollama_models.py); None = only the
    # served one
    catalog: Catalog | None = None
    # seconds the model stays loaded after the last request (Ollama's keep_alive; a request's own keep_alive wins
    # on /api/*); None = forever.  app/server/keep_alive.py
    keep_alive_s: float | None = None


class _Guard:
    """Pure ASGI middleware (streams and disconnects pass through untouched): API key, Content-Length limit,
    and the requests-by-status counter."""

    def __init__(self, app: Any, config: ServerConfig, metrics: ServerMetrics, keep_alive: KeepAlive) -> None:
        self.app, self.config, self.metrics, self.keep_alive = app, config, metrics, keep_alive

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
                error = APIError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer KEY'",
                    type="authentication_error",
                    code="invalid_api_key",
                )
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
                respond = ollama_error if path.startswith("/api/") else _json_error  # each API's error shape
                await respond(error)(scope, receive, counting_send)
            elif path in STATUS_PATHS:
                await self.app(scope, receive, counting_send)
            else:
                with self.keep_alive.busy():  # the model is in use: keep_alive counts from the last one's end
                    await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(label, str(status_seen[0] if status_seen else 499)).inc()


_KNOWN_PATHS = {
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/health",
    "/metrics",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
    "/api/pull",
}


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", code="body_too_large")


def _json_error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def create_app(backend: Backend, config: ServerConfig) -> FastAPI:
    """An app serving `backend` (already loaded).  The caller owns the backend and closes it."""
    metrics = ServerMetrics()
    runner = Runner(backend, config.limits, metrics)
    keep_alive = KeepAlive(backend, config.keep_alive_s)
    app = FastAPI(title="hearth", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runner = runner
    app.state.metrics = metrics
    app.state.keep_alive = keep_alive

    @app.exception_handler(APIError)
    async def _api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
        return _json_error(exc)

    @app.exception_handler(InvalidRequestError)
    async def _invalid_request(_: HTTPRequest, exc: InvalidRequestError) -> JSONResponse:
        return _json_error(APIError(400, str(exc)))  # SamplingParams refused a value (e.g. a seed beyond 64 bits)

    @app.exception_handler(404)
    async def _not_found(request: HTTPRequest, _: Exception) -> JSONResponse:
        respond = ollama_error if request.url.path.startswith("/api/") else _json_error
        return respond(APIError(404, f"no such endpoint: {request.url.path}", code="not_found"))

    @app.exception_handler(405)
    async def _bad_method(request: HTTPRequest, _: Exception) -> JSONResponse:
        respond = ollama_error if request.url.path.startswith("/api/") else _json_error
        return respond(APIError(405, f"{request.method} is not allowed on {request.url.path}"))

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
        built = await run_in_threadpool(_chat_request, backend, [m.as_dict() for m in body.messages], sampling, tools)
        if built.tools is not None and body.logprobs:  # held-back call text no longer lines up with its tokens
            raise APIError(400, "logprobs with tools is not supported: ask for one of them", param="logprobs")
        req = await run_in_threadpool(_constrained, built.request, body)
        return await _respond(
            request,
            runner,
            choice_requests(req, body.n),
            body,
            chat=True,
            model_name=config.model_name,
            tools=built.tools,
        )

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest) -> Response:
        body = await _parse(request, CompletionRequest, config)
        req = _completion_request(body, _sampling(body, body.max_tokens, backend, config), backend)
        req = await run_in_threadpool(_constrained, req, body)
        echo = None
        if body.echo:  # the prompt's text as given, or its token ids' text
            echo = (
                body.prompt
                if isinstance(body.prompt, str)
                else await run_in_threadpool(backend.detokenize, body.prompt)
            )
        return await _respond(
            request, runner, choice_requests(req, body.n), body, chat=False, model_name=config.model_name, echo=echo
        )

    @app.post("/v1/embeddings")
    async def embeddings(request: HTTPRequest) -> Response:
        body = await _parse(request, EmbeddingRequest, config)
        return await _unless_gone_response(request, _as_json(openai_embeddings(backend, body)))

    # Ollama's API on the same server (app/server/ollama.py): its own error shape, the same request path
    add_ollama_routes(
        app,
        backend,
        runner,
        config.model_name,
        config.limits.max_body_bytes,
        config.catalog,
        _unless_gone_response,
        keep_alive,
    )
    app.add_middleware(_Guard, config=config, metrics=metrics, keep_alive=keep_alive)
    return app


async def _as_json(work: Awaitable[dict]) -> Response:
    return JSONResponse(await work)


async def _unless_gone_response(request: HTTPRequest, work: Awaitable[Response]) -> Response:
    """`work`'s response, or a 499 once the client disconnects first (the work is cancelled)."""
    try:
        return await _unless_gone(request, work)
    except _ClientGone:
        return Response(status_code=499)


_UNION_TAGS = {"float", "int", "str", "bool", "list"}


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hearth"}


def _unknown_model(name: str, served: str) -> APIError:
    return APIError(
        404, f"model {name!r} is not served here; this server serves {served!r}", param="model", code="model_not_found"
    )


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
    if body.model != config.model_name:
        raise _unknown_model(body.model, config.model_name)
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
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


def _chat_request(
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
    constraint = constraint_of(body.response_format)
    if constraint is not None and req.constraint is not None:  # a forced tool_choice constrains it already
        raise APIError(
            400,
            "response_format and a forced tool_choice both constrain the reply; send one of them",
            param="response_format",
        )
    return req if constraint is None else dataclasses.replace(req, constraint=constraint)


def _request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def _sampling(body: Any, max_tokens: int | None, backend: Backend, config: ServerConfig) -> SamplingParams:
    """What the OpenAI request asks for, with OpenAI's semantics: temperature/top_p as given (defaults 1), no
    top_k/min_p truncation the client did not ask for (hearth's own defaults are for `hearth run` and the TUI)."""
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
    return SamplingParams(
        temperature=float(body.temperature) if body.temperature is not None else 1.0,
        top_p=float(body.top_p) if body.top_p is not None else 1.0,
        top_k=body.top_k if body.top_k is not None else 0,
        min_p=float(body.min_p) if body.min_p is not None else 0.0,
        repeat_penalty=float(body.repeat_penalty) if body.repeat_penalty is not None else 1.0,
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


def _usage(gens: list[Generation | None]) -> dict:
    """The prompt counts once (every choice has the same prompt); completions add up over the choices."""
    p = c = 0
    for i, gen in enumerate(gens):
        if gen is None:
            continue
        stats = gen.finished.stats if gen.finished and gen.finished.stats else gen.started.stats
        if stats is not None:
            p = stats.prompt_tokens if i == 0 else p
            c += stats.completion_tokens
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


async def _respond(
    request: HTTPRequest,
    runner: Runner,
    reqs: list[Request],
    body: Any,
    *,
    chat: bool,
    model_name: str,
    echo: str | None = None,
    tools: ToolReading | None = None,
) -> Response:
    try:
        return await _unless_gone(
            request, _answer(runner, reqs, body, chat=chat, model_name=model_name, echo=echo, tools=tools)
        )
    except _ClientGone:
        return Response(status_code=499)  # nobody reads it; the metrics count it as "client closed request"


def _failed(event: Any, constraint_param: str | None = None) -> APIError:
    """The error of a reply that ended with FinishReason.ERROR: a 400 when its constraint hit llguidance's limits
    (the schema's fault: app/server/response_format.limit_error), else a 500."""
    limit = limit_error(event, constraint_param)
    if limit is not None:
        return limit
    return APIError(500, f"generation failed: {event.error}", type="server_error", code=event.error_code)


async def _answer(
    runner: Runner,
    reqs: list[Request],
    body: Any,
    *,
    chat: bool,
    model_name: str,
    echo: str | None,
    tools: ToolReading | None = None,
) -> Response:
    """Waits for a slot and, unless streaming, for the whole reply: both end early when the client leaves.
    `reqs`: one request per choice (app/server/choices.py); `echo`: the prompt's text when it is echoed.
    With tools, each choice's calls are parsed out of its text (app/server/tool_replies.py)."""
    param = constraint_param(body, reqs[0])  # the field a constraint's errors name
    choices = Choices(runner, reqs)
    try:
        await choices.open()  # choice 0's errors (prompt too long, queue full) are the HTTP status
    except APIError as exc:
        raise named(exc, param) from None
    n = len(reqs)
    replies = [ToolReply(tools) if tools is not None else None for _ in range(n)]
    created = int(time.time())
    rid = ("chatcmpl-" if chat else "cmpl-") + reqs[0].request_id[4:]
    obj = "chat.completion" if chat else "text_completion"
    want_logprobs = body.logprobs if chat else body.logprobs is not None
    gens: list[Generation | None] = [None] * n
    if not body.stream:
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list] = [[] for _ in range(n)]
        events = choices.events()
        try:
            async for index, gen, item in events:
                if isinstance(item, APIError):
                    raise named(item, param)
                if item is None:
                    gens[index] = gen
                    if echo is not None and want_logprobs:
                        logprobs[index].extend(gen.started.prompt_logprobs)
                elif item.kind is EventKind.TOKEN:
                    texts[index].append(item.text)
                    logprobs[index].extend(item.logprobs)
                elif item.kind is EventKind.FINISHED and item.finish_reason.value == "error":
                    raise _failed(item, param)
        finally:
            await events.aclose()
        out = []
        for i, gen in enumerate(gens):
            text = "".join(texts[i])
            choice: dict = {"index": i, "finish_reason": _finish(gen), "logprobs": None}
            reply = replies[i]
            if reply is not None:
                choice["message"] = reply.message(text)
                choice["finish_reason"] = reply.finish_reason(choice["finish_reason"])
            elif chat:
                choice["message"] = {"role": "assistant", "content": text}
                if want_logprobs:
                    choice["logprobs"] = chat_logprobs(logprobs[i])
            else:
                choice["text"] = (echo or "") + text
                if want_logprobs:
                    choice["logprobs"] = CompletionLogprobs().part(logprobs[i])
            out.append(choice)
        return JSONResponse(
            {"id": rid, "object": obj, "created": created, "model": model_name, "choices": out, "usage": _usage(gens)}
        )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunk_obj = "chat.completion.chunk" if chat else "text_completion"
    offsets = [CompletionLogprobs() for _ in range(n)]

    def sse(choices: list, usage: dict | None = None) -> bytes:
        payload: dict = {"id": rid, "object": chunk_obj, "created": created, "model": model_name, "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n".encode()

    def choice(index: int, text: str | None, finish: str | None, entries: tuple = (), first: bool = False) -> dict:
        if chat:
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            lp = chat_logprobs(entries) if want_logprobs and entries else None
            return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}
        lp = offsets[index].part(entries) if want_logprobs and entries else None
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": lp}

    def pieces(index: int, text: str, entries: tuple = (), final: bool = False) -> list[bytes]:
        reply = replies[index]
        if reply is None:
            return [sse([choice(index, text, None, entries)])] if text or entries else []
        deltas = reply.feed(text) + (reply.finish() if final else [])
        return [sse([{"index": index, "delta": d, "finish_reason": None, "logprobs": None}]) for d in deltas]

    async def stream():
        events = choices.events()
        try:
            async for index, gen, item in events:
                if isinstance(item, APIError):
                    yield f"data: {json.dumps(named(item, param).body())}\n\n".encode()
                elif item is None:  # this choice started
                    gens[index] = gen
                    if chat:
                        yield sse([choice(index, None, None, first=True)])
                    elif echo is not None:
                        prompt_lps = gen.started.prompt_logprobs if want_logprobs else ()
                        yield sse([choice(index, echo, None, prompt_lps)])
                elif item.kind is EventKind.TOKEN and (item.text or item.logprobs):
                    for chunk in pieces(index, item.text, item.logprobs):
                        yield chunk
                elif item.kind is EventKind.FINISHED:
                    for chunk in pieces(index, "", final=True):
                        yield chunk
                    if item.finish_reason.value == "error":
                        yield f"data: {json.dumps(_failed(item, param).body())}\n\n".encode()
                    finish, reply = _finish(gen), replies[index]
                    yield sse([choice(index, None, reply.finish_reason(finish) if reply is not None else finish)])
            if include_usage:
                yield sse([], _usage(gens))
            yield b"data: [DONE]\n\n"
        finally:
            await events.aclose()  # cancels every choice still running (client gone): their requests abort

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
