"""Ollama's REST API on hearth's server: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
/api/show, /api/ps, /api/version, /api/pull, so clients built for Ollama work unchanged.

Every route translates into the same internal path as the OpenAI routes: app/requests.py builds the Request
(the model's own template, tools), the server's Runner admits and streams it, `format` goes through the
response_format compiler (app/server/response_format.py: a bad or unsatisfiable schema is a 400 before a model
sees it), embeddings through app/server/embeddings.py.  Only the shapes differ:
- streams are NDJSON (one JSON object a line), on by default as in Ollama; the last line has `done: true`,
  `done_reason` and the counters in nanoseconds: total_duration, load_duration, prompt_eval_count,
  prompt_eval_duration, eval_count, eval_duration;
- errors are `{"error": "..."}` with a 4xx/5xx status (the ollama Python client raises ResponseError with it);
- tool calls are `message.tool_calls: [{"function": {"name", "arguments": {...}}}]`, arguments as an object.
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
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.defaults import SYSTEM_PROMPT
from app.server.embeddings import embed_inputs
from app.server.errors import APIError, engine_error, internal_error
from app.server.keep_alive import KeepAlive
from app.server.ollama_models import (
    Catalog,
    CatalogEntry,
    entry_for,
    ps_entry,
    same_model,
    show_body,
    tags_entry,
    timestamp,
)
from app.server.ollama_requests import (
    build_request,
    check_options_only,
    messages_of,
    refuse_embedding_model,
    request_keep_alive,
    sampling_of,
    think_vars,
    tools_of,
    validate_body,
    with_format,
)
from app.server.ollama_schemas import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    ModelBody,
)
from app.server.response_format import limit_error, named
from app.server.runner import Generation, Runner
from app.server.tool_replies import ToolReply
from backends.api import Backend, EventKind, Request
from backends.tools.render import ToolReading

# The Ollama API version /api/version reports: the one whose docs/api.md these routes follow.  Clients compare
# it to gate features (tools, structured outputs, think), so it is Ollama's numbering, not hearth's.
OLLAMA_API_VERSION = "0.12.0"


def ollama_error(err: APIError) -> JSONResponse:
    """Ollama's error body: {"error": message}."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


def ollama_stream_error(err: APIError) -> bytes:
    """The error line of an NDJSON stream, Ollama's way (its client raises ResponseError on it)."""
    return (json.dumps({"error": err.message}) + "\n").encode()


def add_ollama_routes(
    app: FastAPI,
    backend: Backend,
    runner: Runner,
    served: str,
    max_body_bytes: int,
    catalog: Catalog | None,
    unless_gone: Callable[[HTTPRequest, Awaitable[Response]], Awaitable[Response]],
    keep_alive: KeepAlive,
) -> None:
    """Register the /api/* routes for `backend`, served as `served` (its registered name).  `unless_gone`:
    app.py's wait that ends (a 499) and cancels the work when the client disconnects first."""
    entry = entry_for(backend.spec, served)

    def entries() -> list[CatalogEntry]:
        listed = catalog() if catalog is not None else []
        if not any(e.name == served for e in listed):
            listed = [entry, *listed]
        return listed

    def check_model(asked: str) -> None:
        if not same_model(asked, served):
            known = any(same_model(asked, e.name) for e in entries())
            why = (
                f"model {asked!r} is registered but this server serves {served!r}: start `hearth serve --model "
                f"{asked.removesuffix(':latest')}` to serve it"
                if known
                else f"model {asked!r} not found: this server serves {served!r} (`hearth models` lists the others)"
            )
            raise APIError(404, why)

    async def parse(request: HTTPRequest, schema: type[BaseModel]) -> Any:
        raw, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise APIError(413, f"request body is larger than {max_body_bytes} bytes")
            raw.append(chunk)
        return await run_in_threadpool(validate_body, b"".join(raw), schema)

    def guarded(route: Callable[[HTTPRequest], Awaitable[Response]]) -> Callable[[HTTPRequest], Awaitable[Response]]:
        async def handler(request: HTTPRequest) -> Response:
            try:
                return await route(request)
            except Exception as exc:  # noqa: BLE001 - APIError as it is; engine errors and bugs by engine_error
                return ollama_error(engine_error(exc, f"{request.method} {request.url.path}"))

        handler.__name__ = route.__name__
        return handler

    # -- models -------------------------------------------------------------------------------------------
    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:  # Ollama answers its root with 200 "Ollama is running"; clients probe it
        return Response("hearth is running (Ollama's API on /api, OpenAI's on /v1)\n", media_type="text/plain")

    @app.get("/api/version")
    async def version() -> dict:
        return {"version": OLLAMA_API_VERSION, "hearth": __version__}

    @app.get("/api/tags")
    async def tags() -> dict:
        listed = await run_in_threadpool(entries)
        return {"models": [tags_entry(e) for e in listed]}

    @app.get("/api/ps")
    async def ps() -> dict:
        if not backend.resident:  # keep_alive unloaded it: nothing is running
            return {"models": []}
        memory = await run_in_threadpool(backend.memory_in_use)
        return {"models": [ps_entry(entry, backend.n_ctx, memory, keep_alive.expires_at)]}

    async def show(request: HTTPRequest) -> Response:
        body = await parse(request, ModelBody)
        asked = body.target()
        if not asked:
            raise APIError(400, "model is required")
        listed = await run_in_threadpool(entries)
        found = next((e for e in listed if same_model(asked, e.name)), None)
        if found is None:
            raise APIError(404, f"model {asked!r} not found (`hearth models` lists the registered ones)")
        return JSONResponse(show_body(found, backend.n_ctx if found.name == served else None))

    async def pull(request: HTTPRequest) -> Response:
        body = await parse(request, ModelBody)
        asked = body.target() or ""
        listed = await run_in_threadpool(entries)
        if any(same_model(asked, e.name) for e in listed):  # already here: what Ollama answers once pulled
            line = {"status": "success"}
            if body.stream:
                return Response(json.dumps(line) + "\n", media_type="application/x-ndjson")
            return JSONResponse(line)
        raise APIError(
            400,
            f"hearth serve does not download models over the API: run `hearth pull REPO_ID` (a Hugging Face GGUF "
            f"repo) or `hearth models add PATH`, then `hearth serve --model NAME`; {asked!r} is not registered",
        )

    app.post("/api/show")(guarded(show))
    app.post("/api/pull")(guarded(pull))

    # -- generation ---------------------------------------------------------------------------------------
    async def chat(request: HTTPRequest) -> Response:
        body: ChatBody = await parse(request, ChatBody)
        check_model(body.model)
        refuse_embedding_model(backend)
        keep = request_keep_alive(body.keep_alive, keep_alive)
        if not body.messages:  # Ollama: an empty chat loads the model (and keep_alive 0 unloads it)
            return await _load_or_unload(keep_alive, keep, served, chat=True, stream=body.stream)
        load_s = await keep_alive.load()
        sampling = sampling_of(body.options, backend)
        tools = tools_of(body.tools)
        messages = messages_of(body.messages)
        if not any(m["role"] == "system" for m in messages):  # Ollama's Modelfile SYSTEM: hearth's default
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        think = think_vars(body.think, backend)
        built = await run_in_threadpool(build_request, backend, messages, sampling, tools, think)
        req = await run_in_threadpool(with_format, built.request, body.format)
        return await _answer(
            request,
            runner,
            req,
            served,
            load_s=load_s,
            chat=True,
            stream=body.stream,
            tools=built.tools,
            think=bool(think),
            unless_gone=unless_gone,
        )

    async def generate(request: HTTPRequest) -> Response:
        body: GenerateBody = await parse(request, GenerateBody)
        check_model(body.model)
        refuse_embedding_model(backend)
        keep = request_keep_alive(body.keep_alive, keep_alive)
        for field, why in (
            ("images", "hearth serves text models (no vision)"),
            ("suffix", "fill-in-the-middle is not supported"),
            ("context", "the deprecated `context` is not supported: send the conversation to /api/chat"),
        ):
            if getattr(body, field):
                raise APIError(400, f"{field}: {why}")
        if body.template:
            raise APIError(400, "template: hearth renders the model's own chat template; use raw: true for raw text")
        if not body.prompt:
            return await _load_or_unload(keep_alive, keep, served, chat=False, stream=body.stream)
        load_s = await keep_alive.load()
        sampling = sampling_of(body.options, backend)
        think = think_vars(body.think, backend)
        if body.raw:
            req = Request(prompt=body.prompt, sampling=sampling, add_special=False)
            reading = None
        else:
            system = body.system if body.system is not None else SYSTEM_PROMPT  # "" sends none
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": body.prompt}
            ]
            built = await run_in_threadpool(build_request, backend, messages, sampling, None, think)
            req, reading = built.request, built.tools
        req = await run_in_threadpool(with_format, req, body.format)
        return await _answer(
            request,
            runner,
            req,
            served,
            load_s=load_s,
            chat=False,
            stream=body.stream,
            tools=reading,
            think=bool(think),
            unless_gone=unless_gone,
        )

    app.post("/api/chat")(guarded(chat))
    app.post("/api/generate")(guarded(generate))

    # -- embeddings ---------------------------------------------------------------------------------------
    async def embed(request: HTTPRequest) -> Response:
        body: EmbedBody = await parse(request, EmbedBody)
        check_model(body.model)
        request_keep_alive(body.keep_alive, keep_alive)
        check_options_only(body.options)
        if body.dimensions is not None and body.dimensions != backend.spec.hidden_size:
            raise APIError(
                400,
                f"dimensions={body.dimensions}: {served} gives {backend.spec.hidden_size}-dimensional embeddings and "
                "its file does not say it may be truncated",
            )
        inputs = [body.input] if isinstance(body.input, str) else list(body.input)
        if not inputs or any(not text for text in inputs):
            raise APIError(400, "input must be a non-empty string or a list of non-empty strings")
        started = time.perf_counter()
        load_s = await keep_alive.load()
        done = await run_in_threadpool(embed_inputs, backend, inputs, body.truncate, "input")
        total = time.perf_counter() - started
        return JSONResponse(
            {
                "model": served,
                "embeddings": [[float(x) for x in row] for row in done.vectors],
                "total_duration": _ns(total),
                "load_duration": _ns(load_s),
                "prompt_eval_count": sum(done.token_counts),
            }
        )

    async def embeddings(request: HTTPRequest) -> Response:
        body: EmbeddingsBody = await parse(request, EmbeddingsBody)
        check_model(body.model)
        request_keep_alive(body.keep_alive, keep_alive)
        check_options_only(body.options)
        if not body.prompt:  # Ollama answers an empty prompt with an empty embedding (it only loads the model)
            return JSONResponse({"embedding": []})
        done = await run_in_threadpool(embed_inputs, backend, [body.prompt], True, "prompt")
        return JSONResponse({"embedding": [float(x) for x in done.vectors[0]]})

    app.post("/api/embed")(guarded(embed))
    app.post("/api/embeddings")(guarded(embeddings))


async def _load_or_unload(keep_alive: KeepAlive, keep: float | None | bool, served: str, chat: bool, stream: bool):
    """Ollama's request without a prompt: keep_alive 0 unloads the model, anything else loads it."""
    if keep is not False and keep is not None and keep <= 0:
        await keep_alive.unload_now()
        return _loaded_reply(served, chat, stream, "unload")
    await keep_alive.load()
    return _loaded_reply(served, chat, stream, "load")


def _ns(seconds: float) -> int:
    return max(int(seconds * 1e9), 0)


def _loaded_reply(served: str, chat: bool, stream: bool, reason: str) -> Response:
    line: dict[str, Any] = {"model": served, "created_at": timestamp(time.time()), "done": True, "done_reason": reason}
    line.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return Response(json.dumps(line) + "\n", media_type="application/x-ndjson") if stream else JSONResponse(line)


# -- answering ------------------------------------------------------------------------------------------------
class _Think:
    """Splits a reply that starts with <think>...</think> into thinking and content (Ollama's message.thinking)."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, on: bool) -> None:
        self.state = "start" if on else "content"
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(thinking, content) of the next piece."""
        if self.state == "after":  # the blank lines between </think> and the answer are not the answer's
            text = text.lstrip("\n")
            if not text:
                return "", ""
            self.state = "content"
        if self.state == "content":
            return "", text
        self.buf += text
        thinking = content = ""
        if self.state == "start":
            stripped = self.buf.lstrip()
            if self.OPEN.startswith(stripped):  # may still become <think>
                return "", ""
            if not stripped.startswith(self.OPEN):
                self.state, content, self.buf = "content", self.buf, ""
                return "", content
            self.state, self.buf = "thinking", stripped[len(self.OPEN) :]
        if self.state == "thinking":
            at = self.buf.find(self.CLOSE)
            if at >= 0:
                thinking, rest = self.buf[:at], self.buf[at + len(self.CLOSE) :]
                self.state, self.buf = "after", ""
                return thinking, self.feed(rest)[1] if rest else ""
            keep = max((k for k in range(1, len(self.CLOSE)) if self.buf.endswith(self.CLOSE[:k])), default=0)
            thinking, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
        return thinking, content

    def flush(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        return (rest, "") if self.state == "thinking" else ("", rest.lstrip("\n") if self.state == "after" else rest)


def _failed(event: Any, param: str | None) -> APIError:
    """A reply that ended in an error: a 400 when its `format` hit llguidance's limits (the schema's fault), else
    a 500."""
    return limit_error(event, param) or APIError(500, f"generation failed: {event.error}")


def _tool_calls(reply: ToolReply) -> list[dict]:
    out = []
    for k, call in enumerate(reply.parser.calls):
        try:
            args: Any = json.loads(call.arguments) if call.arguments else {}
        except ValueError:
            args = call.arguments
        out.append({"id": call.id, "function": {"index": k, "name": call.name, "arguments": args}})
    return out


def _counters(gen: Generation, total_s: float, load_s: float) -> dict[str, Any]:
    stats = gen.finished.stats if gen.finished and gen.finished.stats else gen.started.stats
    reason = gen.finished.finish_reason.value if gen.finished else "stop"
    prefill = max((stats.ttft_s - stats.queue_s) if stats else 0.0, 0.0)
    return {
        "done": True,
        "done_reason": reason if reason in ("stop", "length") else "stop",
        "total_duration": _ns(total_s),
        "load_duration": _ns(load_s),  # 0 unless keep_alive had unloaded it
        "prompt_eval_count": stats.prompt_tokens if stats else 0,
        "prompt_eval_duration": _ns(prefill),
        "eval_count": stats.completion_tokens if stats else 0,
        "eval_duration": _ns(stats.decode_s if stats else 0.0),
    }


async def _answer(
    request: HTTPRequest,
    runner: Runner,
    req: Request,
    served: str,
    *,
    load_s: float,
    chat: bool,
    stream: bool,
    tools: ToolReading | None,
    think: bool,
    unless_gone: Callable[[HTTPRequest, Awaitable[Response]], Awaitable[Response]],
) -> Response:
    arrived = time.perf_counter()
    param = "format" if req.constraint is not None else None  # the field a constraint's errors name
    try:
        gen = await runner.open(req)  # admission and STARTED: errors here are the status (prompt too long, 429)
    except APIError as exc:
        raise named(exc, param) from None
    reply = ToolReply(tools) if tools is not None else None
    splitter = _Think(think)

    def line(text: str, thinking: str, calls: list[dict] | None = None, final: dict | None = None) -> dict:
        out: dict[str, Any] = {"model": served, "created_at": timestamp(time.time())}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out.update(final or {"done": False})
        return out

    def pieces(text: str) -> tuple[str, str]:
        """(thinking, visible text) of the next piece; tool-call text is held by the parser until it is known."""
        thinking, content = splitter.feed(text)
        if reply is not None and content:
            content = "".join(d.get("content", "") for d in reply.feed(content))
        return thinking, content

    def closing() -> tuple[str, str, list[dict] | None]:
        thinking, content = splitter.flush()
        calls = None
        if reply is not None:
            content = "".join(d.get("content", "") for d in reply.feed(content) + reply.finish())
            calls = _tool_calls(reply) or None
        return thinking, content, calls

    if not stream:

        async def collect() -> dict:
            thinking_parts, parts = [], []
            async for event in gen.events():
                if event.kind is EventKind.TOKEN and event.text:
                    th, text = pieces(event.text)
                    thinking_parts.append(th)
                    parts.append(text)
                elif event.kind is EventKind.FINISHED and event.finish_reason.value == "error":
                    raise _failed(event, param)
            th, text, calls = closing()
            return line(
                "".join(parts) + text,
                "".join(thinking_parts) + th,
                calls,
                _counters(gen, time.perf_counter() - arrived + load_s, load_s),
            )

        async def respond() -> Response:
            return JSONResponse(await collect())

        return await unless_gone(request, respond())  # a client that leaves aborts the request (a 499)

    async def lines():
        try:
            async for event in gen.events():
                if event.kind is EventKind.TOKEN and event.text:
                    th, text = pieces(event.text)
                    if th or text:
                        yield (json.dumps(line(text, th)) + "\n").encode()
                elif event.kind is EventKind.FINISHED:
                    th, text, calls = closing()
                    if th or text or calls:
                        yield (json.dumps(line(text, th, calls)) + "\n").encode()
                    if event.finish_reason.value == "error":
                        yield ollama_stream_error(_failed(event, param))
                        return
                    yield (
                        json.dumps(line("", "", None, _counters(gen, time.perf_counter() - arrived + load_s, load_s)))
                        + "\n"
                    ).encode()
        except APIError as exc:
            yield ollama_stream_error(exc)
        except Exception as exc:  # noqa: BLE001 - a bug mid-stream: the client reads an error line, never a cut
            yield ollama_stream_error(internal_error(exc, f"the stream of {req.request_id}"))

    return StreamingResponse(lines(), media_type="application/x-ndjson")
