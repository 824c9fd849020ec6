"""Ollama's REST API on hearth's server: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
/api/show, /api/ps, /api/version, /api/pull, so clients built for Ollama work unchanged.

Every route translates into the same internal path as the OpenAI routes: app/requests.py builds the Request
(the model's own template, tools), the server's Runner admits and streams it, `format` goes through the
response_format compiler (app/server/response_format.py: a bad or unsatisfiable schema is a 400 before a model
sees it), embeddings through app/server/embeddings.py, and the answer through the same loops as OpenAI's
(app/server/ollama_answers.py: Ollama's framing over app/server/answers.py).  Only the shapes differ:
- streams are NDJSON (one JSON object a line), on by default as in Ollama; the last line has `done: true`,
  `done_reason` and the counters in nanoseconds: total_duration, load_duration, prompt_eval_count,
  prompt_eval_duration, eval_count, eval_duration;
- errors are `{"error": "..."}` with a 4xx/5xx status (the ollama Python client raises ResponseError with it);
- tool calls are `message.tool_calls: [{"function": {"name", "arguments": {...}}}]`, arguments as an object.
Bodies are read as OpenAI's are (app/server/body.py) and validated Ollama's way (app/server/ollama_requests.py).
A request without a system message gets hearth's default one (app/defaults.py), where Ollama would use the
Modelfile's SYSTEM: the model's own template default can be worse (README "Choices hearth makes for you").
`keep_alive` (a duration or seconds; 0 unloads, negative keeps forever) is when the model is unloaded after this
request (app/server/keep_alive.py); the next request loads it again and reports that as load_duration.  The
server holds one model, the one `hearth serve --model M` started with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.defaults import SYSTEM_PROMPT
from app.server.embeddings import check_dimensions, embed_inputs
from app.server.errors import APIError, engine_error
from app.server.ollama_answers import loaded_reply, ns, ollama_answer, ollama_error
from app.server.ollama_models import (
    Catalog,
    CatalogEntry,
    entry_for,
    ps_entry,
    same_model,
    show_body,
    tags_entry,
)
from app.server.ollama_requests import (
    build_request,
    check_options_only,
    keep_alive_value,
    logprobs_of,
    messages_of,
    parse_body,
    refuse_embedding_model,
    sampling_of,
    think_vars,
    tools_of,
    with_format,
)
from app.server.ollama_schemas import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    ModelBody,
)
from app.server.pool import ModelPool, Served
from app.server.think import ThinkSplitter as _Think  # noqa: F401 - tests reach the splitter here, as before
from backends.api import Backend, Request

# The Ollama API version /api/version reports: the one whose docs/api.md these routes follow.  Clients compare
# it to gate features (tools, structured outputs, think, logprobs), so it is Ollama's numbering, not hearth's:
# 0.12.11 added logprobs and top_logprobs, the newest fields hearth serves (the official client 0.6.3 sends them).
OLLAMA_API_VERSION = "0.12.11"

_Route = Callable[[HTTPRequest], Awaitable[Response]]


def add_ollama_routes(
    app: FastAPI,
    pool: ModelPool,
    max_body_bytes: int,
    catalog: Catalog | None,
    unless_gone: Callable[[HTTPRequest, Awaitable[Response]], Awaitable[Response]],
) -> None:
    """Register the /api/* routes over the server's models (`pool`: app/server/pool.py loads the one a request
    names).  `unless_gone`: app.py's wait that ends (a 499) and cancels the work when the client leaves first."""
    api = _OllamaAPI(pool, max_body_bytes, catalog, unless_gone)
    # -- models -------------------------------------------------------------------------------------------
    app.api_route("/", methods=["GET", "HEAD"])(root)
    app.get("/api/version")(version)
    app.get("/api/tags")(api.tags)
    app.get("/api/ps")(api.ps)
    app.post("/api/show")(_guarded(api.show))
    app.post("/api/pull")(_guarded(api.pull))
    # -- generation ---------------------------------------------------------------------------------------
    app.post("/api/chat")(_guarded(api.chat))
    app.post("/api/generate")(_guarded(api.generate))
    # -- embeddings ---------------------------------------------------------------------------------------
    app.post("/api/embed")(_guarded(api.embed))
    app.post("/api/embeddings")(_guarded(api.embeddings))


def _guarded(route: _Route) -> _Route:
    """`route` answering every error in Ollama's shape: an APIError as it is, engine errors and bugs by
    engine_error (which logs a bug's id and traceback)."""

    async def handler(request: HTTPRequest) -> Response:
        try:
            return await route(request)
        except Exception as exc:  # noqa: BLE001 - APIError as it is; engine errors and bugs by engine_error
            return ollama_error(engine_error(exc, f"{request.method} {request.url.path}"))

    handler.__name__ = route.__name__
    return handler


async def root() -> Response:
    """Ollama answers its root with 200 "Ollama is running"; clients probe it."""
    return Response("hearth is running (Ollama's API on /api, OpenAI's on /v1)\n", media_type="text/plain")


async def version() -> dict:
    return {"version": OLLAMA_API_VERSION, "hearth": __version__}


class _OllamaAPI:
    """The /api/* handlers of one server: its models (the pool) and what they share."""

    def __init__(
        self,
        pool: ModelPool,
        max_body_bytes: int,
        catalog: Catalog | None,
        unless_gone: Callable[[HTTPRequest, Awaitable[Response]], Awaitable[Response]],
    ) -> None:
        self.pool = pool
        self.max_body_bytes = max_body_bytes
        self.catalog = catalog
        self.unless_gone = unless_gone
        first = pool.served[pool.default]
        self.default_entry = entry_for(first.backend.spec, first.name)

    # -- shared -------------------------------------------------------------------------------------------
    def entries(self) -> list[CatalogEntry]:
        """The registered models, the served one first when the catalog lacks it."""
        listed = self.catalog() if self.catalog is not None else []
        if not any(e.name == self.default_entry.name for e in listed):
            listed = [self.default_entry, *listed]
        return listed

    async def model(self, request: HTTPRequest, asked: str, keep_alive: Any) -> tuple[Served, float]:
        """The model `asked` names, loaded on demand and held busy for the request (ModelPool.acquire), with the
        request's keep_alive (checked first: a bad one is a 400 before anything loads); the load's seconds."""
        seconds = keep_alive_value(keep_alive)
        served, load_s = await self.pool.acquire(request, asked)
        if seconds is not False:
            served.keep_alive.request_keep_alive(seconds)
        return served, load_s

    async def parse(self, request: HTTPRequest, schema: type[BaseModel]) -> Any:
        return await parse_body(request, schema, self.max_body_bytes)

    async def answer(
        self,
        request: HTTPRequest,
        served: Served,
        req: Request,
        load_s: float,
        *,
        chat: bool,
        stream: bool,
        tools: Any,
        think: bool,
    ) -> Response:
        """`req` run and answered in Ollama's framing (app/server/ollama_answers.py)."""
        return await ollama_answer(
            request,
            served.runner,
            req,
            served.name,
            load_s=load_s,
            chat=chat,
            stream=stream,
            tools=tools,
            think=think,
            unless_gone=self.unless_gone,
        )

    # -- models -------------------------------------------------------------------------------------------
    async def tags(self) -> dict:
        listed = await run_in_threadpool(self.entries)
        return {"models": [tags_entry(e) for e in listed]}

    async def ps(self) -> dict:
        """The models loaded now, most recently used first (none that keep_alive unloaded)."""
        out = []
        for served in self.pool.resident():
            memory = await run_in_threadpool(served.backend.memory_in_use)
            entry = entry_for(served.backend.spec, served.name)
            out.append(ps_entry(entry, served.backend.n_ctx, memory, served.keep_alive.expires_at))
        return {"models": out}

    async def show(self, request: HTTPRequest) -> Response:
        body = await self.parse(request, ModelBody)
        asked = body.target()
        if not asked:
            raise APIError(400, "model is required")
        listed = await run_in_threadpool(self.entries)
        found = next((e for e in listed if same_model(asked, e.name)), None)
        if found is None:
            raise APIError(404, f"model {asked!r} not found (`hearth models` lists the registered ones)")
        loaded = self.pool.find(found.name)
        return JSONResponse(show_body(found, loaded.backend.n_ctx if loaded is not None else None))

    async def pull(self, request: HTTPRequest) -> Response:
        body = await self.parse(request, ModelBody)
        asked = body.target() or ""
        listed = await run_in_threadpool(self.entries)
        if any(same_model(asked, e.name) for e in listed):  # already here: what Ollama answers once pulled
            line = {"status": "success"}
            if body.stream:
                return Response(json.dumps(line) + "\n", media_type="application/x-ndjson")
            return JSONResponse(line)
        raise APIError(
            400,
            f"hearth serve does not download models over the API: run `hearth pull REPO_ID` (a Hugging Face GGUF "
            f"repo) or `hearth models add PATH`, then ask for it by name; {asked!r} is not registered",
        )

    # -- generation ---------------------------------------------------------------------------------------
    async def chat(self, request: HTTPRequest) -> Response:
        body: ChatBody = await self.parse(request, ChatBody)
        if not body.messages:  # Ollama: an empty chat loads the model (and keep_alive 0 unloads it)
            return await self.load_or_unload(request, body.model, body.keep_alive, chat=True, stream=body.stream)
        served, load_s = await self.model(request, body.model, body.keep_alive)
        backend = served.backend
        refuse_embedding_model(backend)
        sampling = sampling_of(body.options, backend, served.name, logprobs_of(body))
        tools = tools_of(body.tools)
        messages = _with_system(messages_of(body.messages))
        think = think_vars(body.think, backend)
        built = await run_in_threadpool(build_request, backend, messages, sampling, tools, think)
        req = await run_in_threadpool(with_format, built.request, body.format)
        return await self.answer(
            request, served, req, load_s, chat=True, stream=body.stream, tools=built.tools, think=bool(think)
        )

    async def generate(self, request: HTTPRequest) -> Response:
        body: GenerateBody = await self.parse(request, GenerateBody)
        _refuse_generate_fields(body)
        if not body.prompt:
            return await self.load_or_unload(request, body.model, body.keep_alive, chat=False, stream=body.stream)
        served, load_s = await self.model(request, body.model, body.keep_alive)
        refuse_embedding_model(served.backend)
        sampling = sampling_of(body.options, served.backend, served.name, logprobs_of(body))
        think = think_vars(body.think, served.backend)
        req, reading = await self.generate_request(served.backend, body, sampling, think)
        req = await run_in_threadpool(with_format, req, body.format)
        return await self.answer(
            request, served, req, load_s, chat=False, stream=body.stream, tools=reading, think=bool(think)
        )

    async def generate_request(
        self, backend: Backend, body: GenerateBody, sampling: Any, think: dict | None
    ) -> tuple[Request, Any]:
        """/api/generate's Request and its tool-call reading (None for raw text): raw text as it is, else the
        prompt as a user message in the model's template, after `system` (hearth's default when not given)."""
        if body.raw:
            return Request(prompt=body.prompt, sampling=sampling, add_special=False), None
        system = body.system if body.system is not None else SYSTEM_PROMPT  # "" sends none
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": body.prompt}
        ]
        built = await run_in_threadpool(build_request, backend, messages, sampling, None, think)
        return built.request, built.tools

    async def load_or_unload(
        self, request: HTTPRequest, asked: str, keep_alive: Any, *, chat: bool, stream: bool
    ) -> Response:
        """Ollama's request without a prompt: keep_alive 0 unloads the model, anything else loads it."""
        seconds = keep_alive_value(keep_alive)
        if seconds is not False and seconds is not None and seconds <= 0:
            found = self.pool.find(asked)
            name = found.name if found is not None else asked.removesuffix(":latest")
            await self.pool.unload(asked)
            return loaded_reply(name, chat, stream, "unload")
        served, _ = await self.model(request, asked, keep_alive)
        return loaded_reply(served.name, chat, stream, "load")

    # -- embeddings ---------------------------------------------------------------------------------------
    async def embed(self, request: HTTPRequest) -> Response:
        body: EmbedBody = await self.parse(request, EmbedBody)
        check_options_only(body.options)
        inputs = [body.input] if isinstance(body.input, str) else list(body.input)
        if not inputs or any(not text for text in inputs):
            raise APIError(400, "input must be a non-empty string or a list of non-empty strings")
        started = time.perf_counter()
        served, load_s = await self.model(request, body.model, body.keep_alive)
        check_dimensions(served.backend, body.dimensions, served.name)
        done = await run_in_threadpool(embed_inputs, served.backend, inputs, body.truncate, "input", body.dimensions)
        total = time.perf_counter() - started
        return JSONResponse(
            {
                "model": served.name,
                "embeddings": [[float(x) for x in row] for row in done.vectors],
                "total_duration": ns(total),
                "load_duration": ns(load_s),
                "prompt_eval_count": sum(done.token_counts),
            }
        )

    async def embeddings(self, request: HTTPRequest) -> Response:
        body: EmbeddingsBody = await self.parse(request, EmbeddingsBody)
        check_options_only(body.options)
        served, _ = await self.model(request, body.model, body.keep_alive)
        if not body.prompt:  # Ollama answers an empty prompt with an empty embedding (it only loads the model)
            return JSONResponse({"embedding": []})
        done = await run_in_threadpool(embed_inputs, served.backend, [body.prompt], True, "prompt")
        return JSONResponse({"embedding": [float(x) for x in done.vectors[0]]})


def _with_system(messages: list[dict]) -> list[dict]:
    """`messages` with hearth's default system message first when they have none (Ollama's Modelfile SYSTEM)."""
    if not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return messages


def _refuse_generate_fields(body: GenerateBody) -> None:
    """A 400 naming the first /api/generate field hearth does not support."""
    for field, why in (
        ("images", "hearth serves text models (no vision)"),
        ("suffix", "fill-in-the-middle is not supported"),
        ("context", "the deprecated `context` is not supported: send the conversation to /api/chat"),
    ):
        if getattr(body, field):
            raise APIError(400, f"{field}: {why}")
    if body.template:
        raise APIError(400, "template: hearth renders the model's own chat template; use raw: true for raw text")
