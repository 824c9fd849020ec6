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

import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.defaults import SYSTEM_PROMPT
from app.requests import ChatRequest, chat_request
from app.server.body import decode_body
from app.server.embeddings import embed_inputs
from app.server.errors import APIError
from app.server.keep_alive import KeepAlive
from app.server.ollama_models import (
    Catalog,
    CatalogEntry,
    entry_for,
    ps_entry,
    same_model,
    show_body,
    tags_entry,
    thinking_template,
    timestamp,
)
from app.server.ollama_schemas import (
    DEFAULTS,
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    ModelBody,
    OptionError,
    check_options,
    keep_alive_seconds,
)
from app.server.response_format import JsonSchemaFormat, ResponseFormat, constraint_of, limit_error, named
from app.server.runner import Generation, Runner
from app.server.tool_replies import ToolReply
from backends.api import Backend, EventKind, Request, SamplingParams
from backends.embeddings import is_embedding_model, not_for_chat
from backends.errors import HearthError, InvalidRequestError
from backends.tools.render import ToolReading
from backends.tools.spec import ToolRequestError, tool_request_from_openai

# The Ollama API version /api/version reports: the one whose docs/api.md these routes follow.  Clients compare
# it to gate features (tools, structured outputs, think), so it is Ollama's numbering, not hearth's.
OLLAMA_API_VERSION = "0.12.0"


def ollama_error(err: APIError) -> JSONResponse:
    """Ollama's error body: {"error": message}."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


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
        return await run_in_threadpool(_validate, b"".join(raw), schema)

    def guarded(route: Callable[[HTTPRequest], Awaitable[Response]]) -> Callable[[HTTPRequest], Awaitable[Response]]:
        async def handler(request: HTTPRequest) -> Response:
            try:
                return await route(request)
            except APIError as exc:
                return ollama_error(exc)
            except InvalidRequestError as exc:
                return ollama_error(APIError(400, exc.one_line()))

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
        _refuse_embedding_model(backend)
        keep = _keep_alive(body.keep_alive, keep_alive)
        if not body.messages:  # Ollama: an empty chat loads the model (and keep_alive 0 unloads it)
            return await _load_or_unload(keep_alive, keep, served, chat=True, stream=body.stream)
        load_s = await keep_alive.load()
        sampling = _sampling(body.options, backend)
        tools = _tools(body.tools)
        messages = _messages(body.messages)
        if not any(m["role"] == "system" for m in messages):  # Ollama's Modelfile SYSTEM: hearth's default
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        think = _think(body.think, backend)
        built = await run_in_threadpool(_build, backend, messages, sampling, tools, think)
        req = await run_in_threadpool(_with_format, built.request, body.format)
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
        _refuse_embedding_model(backend)
        keep = _keep_alive(body.keep_alive, keep_alive)
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
        sampling = _sampling(body.options, backend)
        think = _think(body.think, backend)
        if body.raw:
            req = Request(prompt=body.prompt, sampling=sampling, add_special=False)
            reading = None
        else:
            system = body.system if body.system is not None else SYSTEM_PROMPT  # "" sends none
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": body.prompt}
            ]
            built = await run_in_threadpool(_build, backend, messages, sampling, None, think)
            req, reading = built.request, built.tools
        req = await run_in_threadpool(_with_format, req, body.format)
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
        _keep_alive(body.keep_alive, keep_alive)
        _options_only_checked(body.options)
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
        _keep_alive(body.keep_alive, keep_alive)
        _options_only_checked(body.options)
        if not body.prompt:  # Ollama answers an empty prompt with an empty embedding (it only loads the model)
            return JSONResponse({"embedding": []})
        done = await run_in_threadpool(embed_inputs, backend, [body.prompt], True, "prompt")
        return JSONResponse({"embedding": [float(x) for x in done.vectors[0]]})

    app.post("/api/embed")(guarded(embed))
    app.post("/api/embeddings")(guarded(embeddings))


# -- body checks ----------------------------------------------------------------------------------------------
def _validate(raw: bytes, schema: type[BaseModel]) -> Any:
    data = decode_body(raw, 64, 4096 if schema is ChatBody else None)
    data = {k: v for k, v in data.items() if v is not None}
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(("function-", "literal")))
        if first.get("type") == "extra_forbidden":
            raise APIError(400, f"unknown field {loc!r}: Ollama's API has no such field") from None
        raise APIError(400, f"{loc or 'body'}: {first.get('msg')}") from None


def _keep_alive(value: Any, keep_alive: KeepAlive) -> float | None | bool:
    """The request's keep_alive in seconds (None: forever; False: not given), set as this request's."""
    if value is None:
        return False
    try:
        seconds = keep_alive_seconds(value)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    keep_alive.request_keep_alive(seconds)
    return seconds


async def _load_or_unload(keep_alive: KeepAlive, keep: float | None | bool, served: str, chat: bool, stream: bool):
    """Ollama's request without a prompt: keep_alive 0 unloads the model, anything else loads it."""
    if keep is not False and keep is not None and keep <= 0:
        await keep_alive.unload_now()
        return _loaded_reply(served, chat, stream, "unload")
    await keep_alive.load()
    return _loaded_reply(served, chat, stream, "load")


def _options_only_checked(raw: dict | None) -> None:
    try:
        check_options(raw)
    except OptionError as exc:
        raise APIError(400, exc.args[0]) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise APIError(400, f"options.{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg')}") from None


def _refuse_embedding_model(backend: Backend) -> None:
    if is_embedding_model(backend.spec):
        raise APIError(400, not_for_chat(backend.spec))


def _sampling(raw: dict | None, backend: Backend) -> SamplingParams:
    """Ollama's options as SamplingParams (ollama_schemas.py: which are honoured, ignored, refused)."""
    try:
        opts, _ignored = check_options(raw)
    except OptionError as exc:
        raise APIError(400, exc.args[0]) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise APIError(400, f"options.{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg')}") from None
    n_ctx = backend.n_ctx
    limit = min(opts.num_ctx, n_ctx) if opts.num_ctx is not None else n_ctx  # num_ctx above the load: the load's
    predict = opts.num_predict
    # -1 (Ollama's default): until a stop or the context is full; -2: fill the context.  The engines stop at
    # the context either way, so both are "at most the context"
    max_tokens = limit if predict is None or predict < 0 else max(min(predict, limit), 1)
    stop = (opts.stop,) if isinstance(opts.stop, str) else tuple(opts.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "options.stop: stop strings must not be empty")
    pick = {k: getattr(opts, k) if getattr(opts, k) is not None else v for k, v in DEFAULTS.items()}
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
        )
    except InvalidRequestError as exc:
        raise APIError(400, f"options: {exc.one_line()}") from None


def _tools(tools: list[dict] | None) -> Any:
    if not tools:
        return None
    try:
        return tool_request_from_openai(tools, "auto", None)
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line()) from None


def _messages(messages: list[Any]) -> list[dict]:
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


def _think(value: Any, backend: Backend) -> dict | None:
    """The template variables for Ollama's `think`, or None when not asked.  A model whose template has no
    thinking switch refuses think: true (as Ollama does); think: false asks for nothing there."""
    if value is None or value is False and not thinking_template(backend.spec):
        return None
    if not thinking_template(backend.spec):
        raise APIError(400, f"{backend.spec.name!r} does not support thinking (its chat template has no switch)")
    return {"enable_thinking": bool(value)} if value is not False else {"enable_thinking": False}


def _build(
    backend: Backend, messages: list[dict], sampling: SamplingParams, tools: Any, think: dict | None
) -> ChatRequest:
    try:
        return chat_request(
            backend.spec, messages, sampling, request_id=_request_id(), tools=tools, template_vars=think or None
        )
    except ToolRequestError as exc:
        raise APIError(400, exc.one_line()) from None
    except HearthError as exc:  # a failing or over-budget template, a bad conversation
        raise APIError(400, exc.one_line()) from None


def _with_format(req: Request, fmt: Any) -> Request:
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


def _request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


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
                        yield (json.dumps({"error": _failed(event, param).message}) + "\n").encode()
                        return
                    yield (
                        json.dumps(line("", "", None, _counters(gen, time.perf_counter() - arrived + load_s, load_s)))
                        + "\n"
                    ).encode()
        except APIError as exc:
            yield (json.dumps({"error": exc.message}) + "\n").encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")
