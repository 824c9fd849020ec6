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
import contextlib
import hmac
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.server.answers import (
    chat_collected,
    chat_streamed,
    completion_collected,
    completion_streamed,
    open_choices,
    sse_error,
)
from app.server.body import too_large
from app.server.choices import Choices, choice_requests
from app.server.config import ServerConfig
from app.server.embeddings import EmbeddingRequest, openai_embeddings
from app.server.errors import APIError, engine_error, internal_error
from app.server.inputs import (
    build_chat_request,
    completion_request,
    constrained,
    parse,
    prioritised,
    sampling_of,
    tools_of,
    unknown_model,
)
from app.server.keep_alive import STATUS_PATHS
from app.server.metrics import ServerMetrics
from app.server.ollama import add_ollama_routes
from app.server.ollama_answers import ollama_error, ollama_stream_error
from app.server.pool import LEASES, ModelPool, Opened
from app.server.response_format import constraint_param
from app.server.schemas import ChatCompletionRequest, CompletionRequest
from backends.api import Backend, EngineStats
from backends.embeddings import is_embedding_model
from backends.errors import HearthError

__all__ = ["ServerConfig", "create_app"]


class _Guard:
    """Pure ASGI middleware (streams and disconnects pass through untouched): API key, Content-Length limit,
    the requests-by-status counter, and the last resort that keeps an unexpected exception from becoming a bare
    "Internal Server Error" (_last_resort)."""

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
                error = APIError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer KEY'",
                    type="authentication_error",
                    code="invalid_api_key",
                )
        if error is None and headers.get("content-length", "").isdigit():
            if int(headers["content-length"]) > self.config.limits.max_body_bytes:
                error = too_large(self.config.limits.max_body_bytes)
        status_seen: list[int] = []

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        label = path if path in _KNOWN_PATHS else "other"
        try:
            if error is not None:
                await error_response(path, error)(scope, receive, counting_send)
            elif path in STATUS_PATHS:
                await self._last_resort(scope, receive, counting_send, status_seen)
            else:
                # the models the request uses (ModelPool.acquire) stay busy until its response has ended, streams
                # included: keep_alive counts from the last one's end, and no model in use is unloaded
                with contextlib.ExitStack() as leases:
                    scope.setdefault("state", {})[LEASES] = leases
                    await self._last_resort(scope, receive, counting_send, status_seen)
        finally:
            self.metrics.requests.labels(label, str(status_seen[0] if status_seen else 499)).inc()

    async def _last_resort(self, scope: dict, receive: Any, send: Any, status_seen: list[int]) -> None:
        """The app, and for an exception that escaped every handler a JSON 500 in the path's API shape, with an
        id the log repeats beside the traceback (errors.internal_error).  Once a response has started its status
        cannot change: a stream then ends with an error line in its own format (the answers' own loops write one
        first wherever they can; this is for what escapes them)."""
        path = scope.get("path", "")
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - the last resort: whatever it is, the client gets JSON
            error = internal_error(exc, f"{scope.get('method', '')} {path}".strip())
            if not status_seen:
                await error_response(path, error)(scope, receive, send)
                return
            line = ollama_stream_error(error) if path.startswith("/api/") else sse_error(error)
            try:
                await send({"type": "http.response.body", "body": line, "more_body": False})
            except Exception:  # noqa: BLE001 - the body was complete already, or the client is gone
                pass


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


def error_response(path: str, err: APIError) -> JSONResponse:
    """`err` in the API's own shape: Ollama's `{"error": ...}` under /api/, OpenAI's elsewhere."""
    if path.startswith("/api/"):
        return ollama_error(err)
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def create_app(backend: Backend, config: ServerConfig) -> FastAPI:
    """An app serving `backend` (already loaded) as `config.model_name`, and with `config.opener` any other local
    model on demand (app/server/pool.py).  The caller closes the pool (app.state.pool) when the server ends."""
    metrics = ServerMetrics(ttft_target_s=backend.options.ttft_target_ms / 1000)
    pool = ModelPool(
        Opened(backend, config.model_name, config.first_plan),
        limits=config.limits,
        metrics=metrics,
        keep_alive_s=config.keep_alive_s,
        opener=config.opener,
        report=config.report,
        max_loaded=config.max_loaded_models,
        catalog=config.catalog,
    )
    app = FastAPI(title="hearth", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pool = pool
    app.state.runner = pool.served[config.model_name].runner  # the first model's (tests, the start-up lines)
    app.state.metrics = metrics
    _error_handlers(app)
    _info_routes(app, pool, config, metrics)
    _generation_routes(app, pool, config)
    _embedding_routes(app, pool, config)
    # Ollama's API on the same server (app/server/ollama.py): its own error shape, the same request path
    add_ollama_routes(app, pool, config.limits.max_body_bytes, config.catalog, _respond)
    app.add_middleware(_Guard, config=config, metrics=metrics)
    return app


def _error_handlers(app: FastAPI) -> None:
    """Every error is an OpenAI-style body with its status (Ollama's `{"error": ...}` under /api/).  What an
    engine call raised on the request path (SamplingParams refusing a seed beyond 64 bits, a runner that crashed
    under a detokenize or a load) is mapped by errors.engine_error; anything else reaches _Guard's last resort."""

    @app.exception_handler(APIError)
    async def _api_error(request: HTTPRequest, exc: APIError) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(HearthError)
    async def _engine_error(request: HTTPRequest, exc: HearthError) -> JSONResponse:
        return error_response(request.url.path, engine_error(exc, f"{request.method} {request.url.path}"))

    @app.exception_handler(404)
    async def _not_found(request: HTTPRequest, _: Exception) -> JSONResponse:
        return error_response(
            request.url.path, APIError(404, f"no such endpoint: {request.url.path}", code="not_found")
        )

    @app.exception_handler(405)
    async def _bad_method(request: HTTPRequest, _: Exception) -> JSONResponse:
        return error_response(request.url.path, APIError(405, f"{request.method} is not allowed on {request.url.path}"))


def _info_routes(app: FastAPI, pool: ModelPool, config: ServerConfig, metrics: ServerMetrics) -> None:
    """/health, /metrics and the model list."""

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": config.model_name, "loaded": [s.name for s in pool.resident()]}

    @app.get("/metrics")
    async def prom() -> Response:
        first = pool.first()
        stats = first.backend.stats() if first is not None else EngineStats()
        return Response(
            metrics.render(stats, [s.name for s in pool.resident()]), media_type="text/plain; version=0.0.4"
        )

    @app.get("/v1/models")
    async def models() -> dict:
        names = await run_in_threadpool(_chat_models, pool, config)
        return {"object": "list", "data": [_model_card(name) for name in names]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict:
        names = await run_in_threadpool(_chat_models, pool, config)
        if name not in names:
            raise unknown_model(name, config.model_name)
        return _model_card(name)


def _chat_models(pool: ModelPool, config: ServerConfig) -> list[str]:
    """The models a request may name: the served one, and with model switching every registered chat model."""
    names = [config.model_name]
    if config.opener is not None and config.catalog is not None:
        names += [e.name for e in config.catalog() if not is_embedding_model(e.spec) and e.name not in names]
    return names


def _generation_routes(app: FastAPI, pool: ModelPool, config: ServerConfig) -> None:
    """/v1/chat/completions and /v1/completions: build the requests (a 400 before any slot is taken), admit
    choice 0 (its errors are the HTTP status), then answer collected or streamed (app/server/answers.py)."""

    @app.post("/v1/chat/completions")
    async def chat(request: HTTPRequest) -> Response:
        body = await parse(request, ChatCompletionRequest, config)
        served, _ = await pool.acquire(request, body.model)  # loads it on demand (app/server/pool.py)
        backend, name = served.backend, served.name
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = sampling_of(body, max_tokens, backend, config, name)
        tools = tools_of(body)
        # the template runs in its own budgeted process; this thread only waits for it
        messages = [m.as_dict() for m in body.messages]
        built = await run_in_threadpool(build_chat_request, backend, messages, sampling, tools)
        if built.tools is not None and body.logprobs:  # held-back call text no longer lines up with its tokens
            raise APIError(400, "logprobs with tools is not supported: ask for one of them", param="logprobs")
        req = prioritised(await run_in_threadpool(constrained, built.request, body), body)
        choices = Choices(served.runner, choice_requests(req, body.n))

        async def answer() -> Response:
            await _open(choices, body)  # choice 0's errors (prompt too long, queue full) are the HTTP status
            if body.stream:
                return chat_streamed(choices, body, name, built.tools)
            return await chat_collected(choices, body, name, built.tools)

        return await _respond(request, answer())

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest) -> Response:
        body = await parse(request, CompletionRequest, config)
        served, _ = await pool.acquire(request, body.model)
        backend, name = served.backend, served.name
        req = completion_request(body, sampling_of(body, body.max_tokens, backend, config, name), backend)
        req = prioritised(await run_in_threadpool(constrained, req, body), body)
        echo = None
        if body.echo:  # the prompt's text as given, or its token ids' text
            echo = (
                body.prompt
                if isinstance(body.prompt, str)
                else await run_in_threadpool(backend.detokenize, body.prompt)
            )
        choices = Choices(served.runner, choice_requests(req, body.n))

        async def answer() -> Response:
            await _open(choices, body)
            if body.stream:
                return completion_streamed(choices, body, name, echo)
            return await completion_collected(choices, body, name, echo)

        return await _respond(request, answer())


async def _open(choices: Choices, body: ChatCompletionRequest | CompletionRequest) -> None:
    """Admit and start choice 0 (answers.open_choices), naming the field its schema came from."""
    await open_choices(choices, constraint_param(body, choices.requests[0]))


def _embedding_routes(app: FastAPI, pool: ModelPool, config: ServerConfig) -> None:
    """/v1/embeddings (app/server/embeddings.py)."""

    @app.post("/v1/embeddings")
    async def embeddings(request: HTTPRequest) -> Response:
        body = await parse(request, EmbeddingRequest, config)
        served, _ = await pool.acquire(request, body.model)
        return await _respond(request, _as_json(openai_embeddings(served.backend, body)))


async def _as_json(work: Awaitable[dict]) -> Response:
    return JSONResponse(await work)


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hearth"}


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


async def _respond(request: HTTPRequest, answer: Awaitable[Response]) -> Response:
    """Waits for a slot and, unless streaming, for the whole reply: both end early when the client leaves."""
    try:
        return await _unless_gone(request, answer)
    except _ClientGone:
        return Response(status_code=499)  # nobody reads it; the metrics count it as "client closed request"
