"""The answer to one generation request, once its choices are admitted: four handlers along the API's two seams,
chat vs completions and collected (one JSON body) vs streamed (server-sent events).

Each handler drains `Choices.events()` (app/server/choices.py): (index, Generation, None) when a choice starts,
(index, Generation, event) for its TOKEN and FINISHED events, (index, None, APIError) when a later choice is
refused.  `Answer` carries what every choice of one answer shares (id, object, created, model, logprobs wanted).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import JSONResponse, StreamingResponse

from app.server.choices import Choices
from app.server.errors import APIError, internal_error
from app.server.logprobs import CompletionLogprobs, chat_logprobs
from app.server.response_format import constraint_param, limit_error, named
from app.server.runner import Generation
from app.server.schemas import ChatCompletionRequest, CompletionRequest, StreamOptions
from app.server.tool_replies import ToolReply
from backends.api import EventKind, GenerationEvent, TokenLogprob
from backends.tools.render import ToolReading

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Answer:
    """What every choice of one answer shares."""

    id: str  # chatcmpl-... / cmpl-..., from choice 0's request id
    object: str  # chat.completion / text_completion (chunks: chat.completion.chunk / text_completion)
    created: int  # unix seconds
    model: str
    want_logprobs: bool
    include_usage: bool = False  # streaming: stream_options.include_usage
    constraint_param: str | None = None  # the field a constraint's errors name (response_format.constraint_param)

    def body(self, choices: list[dict]) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model, "choices": choices}

    def sse(self, choices: list[dict], usage: dict | None = None) -> bytes:
        payload = self.body(choices)
        if self.include_usage:
            payload["usage"] = usage
        return _sse(payload)


def _sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def sse_error(err: APIError) -> bytes:
    """An error event of a stream, OpenAI's way (the openai client raises APIError on it)."""
    return _sse(err.body())


def _answer(
    choices: Choices,
    prefix: str,
    obj: str,
    model: str,
    want_logprobs: bool,
    options: StreamOptions | None,
    body: ChatCompletionRequest | CompletionRequest,
) -> Answer:
    return Answer(
        id=prefix + choices.requests[0].request_id[4:],
        object=obj,
        created=int(time.time()),
        model=model,
        want_logprobs=want_logprobs,
        include_usage=bool(options and options.include_usage),
        constraint_param=constraint_param(body, choices.requests[0]),
    )


def usage(gens: list[Generation | None]) -> dict:
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


def finish_reason(gen: Generation) -> str:
    reason = gen.finished.finish_reason.value if gen.finished else "abort"
    return reason if reason in ("stop", "length") else "stop"


def failed(event: GenerationEvent, param: str | None = None) -> APIError:
    """The error of a reply that ended with FinishReason.ERROR: a 400 when its constraint hit llguidance's limits
    (the schema's fault: app/server/response_format.limit_error), else a 500."""
    limit = limit_error(event, param)
    if limit is not None:
        return limit
    return APIError(500, f"generation failed: {event.error}", type="server_error", code=event.error_code)


# ---- collected: one JSON body once every choice has finished


@dataclass
class _Collected:
    gens: list[Generation | None]
    texts: list[str]
    logprobs: list[list[TokenLogprob]]


async def _collect(choices: Choices, prompt_logprobs: bool, param: str | None) -> _Collected:
    """Every choice's text and logprob entries; a refused choice or a failed generation raises its APIError."""
    n = len(choices.requests)
    gens: list[Generation | None] = [None] * n
    texts: list[list[str]] = [[] for _ in range(n)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
    events = choices.events()
    try:
        async for index, gen, item in events:
            if isinstance(item, APIError):
                raise named(item, param)
            if item is None:
                gens[index] = gen
                if prompt_logprobs:
                    logprobs[index].extend(gen.started.prompt_logprobs)
            elif item.kind is EventKind.TOKEN:
                texts[index].append(item.text)
                logprobs[index].extend(item.logprobs)
            elif item.kind is EventKind.FINISHED and item.finish_reason.value == "error":
                raise failed(item, param)
    finally:
        await events.aclose()
    return _Collected(gens, ["".join(t) for t in texts], logprobs)


async def chat_collected(
    choices: Choices, body: ChatCompletionRequest, model: str, tools: ToolReading | None
) -> JSONResponse:
    answer = _answer(choices, "chatcmpl-", "chat.completion", model, body.logprobs, None, body)
    got = await _collect(choices, prompt_logprobs=False, param=answer.constraint_param)
    out = []
    for i, gen in enumerate(got.gens):
        choice: dict = {"index": i, "finish_reason": finish_reason(gen), "logprobs": None}
        if tools is not None:  # each choice's calls parsed out of its text (app/server/tool_replies.py)
            reply = ToolReply(tools)
            choice["message"] = reply.message(got.texts[i])
            choice["finish_reason"] = reply.finish_reason(choice["finish_reason"])
        else:
            choice["message"] = {"role": "assistant", "content": got.texts[i]}
            if answer.want_logprobs:
                choice["logprobs"] = chat_logprobs(got.logprobs[i])
        out.append(choice)
    return JSONResponse({**answer.body(out), "usage": usage(got.gens)})


async def completion_collected(choices: Choices, body: CompletionRequest, model: str, echo: str | None) -> JSONResponse:
    """`echo`: the prompt's text when the request echoes it (its logprobs lead the choice's when asked)."""
    want = body.logprobs is not None
    answer = _answer(choices, "cmpl-", "text_completion", model, want, None, body)
    got = await _collect(choices, prompt_logprobs=echo is not None and want, param=answer.constraint_param)
    out = []
    for i, gen in enumerate(got.gens):
        choice: dict = {"index": i, "finish_reason": finish_reason(gen), "logprobs": None}
        choice["text"] = (echo or "") + got.texts[i]
        if want:
            choice["logprobs"] = CompletionLogprobs().part(got.logprobs[i])
        out.append(choice)
    return JSONResponse({**answer.body(out), "usage": usage(got.gens)})


# ---- streamed: server-sent events as tokens arrive, interleaved over choices (each chunk names its index)


class _ChatChunks:
    """Chat chunks: a first delta with the role, content deltas (or, with tools, the ToolReply's deltas), a
    last one with the finish reason."""

    def __init__(self, answer: Answer, n: int, tools: ToolReading | None) -> None:
        self.answer = answer
        self.replies = [ToolReply(tools) if tools is not None else None for _ in range(n)]

    def _choice(self, index: int, text: str | None, finish: str | None, entries: tuple = (), first=False) -> dict:
        delta: dict = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        lp = chat_logprobs(entries) if self.answer.want_logprobs and entries else None
        return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}

    def started(self, index: int, gen: Generation) -> list[bytes]:
        return [self.answer.sse([self._choice(index, None, None, first=True)])]

    def token(self, index: int, text: str, entries: tuple = (), final: bool = False) -> list[bytes]:
        reply = self.replies[index]
        if reply is None:
            return [self.answer.sse([self._choice(index, text, None, entries)])] if text or entries else []
        deltas = reply.feed(text) + (reply.finish() if final else [])
        return [
            self.answer.sse([{"index": index, "delta": d, "finish_reason": None, "logprobs": None}]) for d in deltas
        ]

    def finished(self, index: int, gen: Generation) -> bytes:
        finish, reply = finish_reason(gen), self.replies[index]
        if reply is not None:
            finish = reply.finish_reason(finish)
        return self.answer.sse([self._choice(index, None, finish)])


class _CompletionChunks:
    """Completion chunks: the echoed prompt first (with its logprobs when asked), then text pieces, then the
    finish reason.  Logprob text offsets run on per choice."""

    def __init__(self, answer: Answer, n: int, echo: str | None) -> None:
        self.answer, self.echo = answer, echo
        self.offsets = [CompletionLogprobs() for _ in range(n)]

    def _choice(self, index: int, text: str | None, finish: str | None, entries: tuple = ()) -> dict:
        lp = self.offsets[index].part(entries) if self.answer.want_logprobs and entries else None
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": lp}

    def started(self, index: int, gen: Generation) -> list[bytes]:
        if self.echo is None:
            return []
        prompt_lps = gen.started.prompt_logprobs if self.answer.want_logprobs else ()
        return [self.answer.sse([self._choice(index, self.echo, None, prompt_lps)])]

    def token(self, index: int, text: str, entries: tuple = (), final: bool = False) -> list[bytes]:
        return [self.answer.sse([self._choice(index, text, None, entries)])] if text or entries else []

    def finished(self, index: int, gen: Generation) -> bytes:
        return self.answer.sse([self._choice(index, None, finish_reason(gen))])


async def _events(choices: Choices, chunks: _ChatChunks | _CompletionChunks) -> AsyncIterator[bytes]:
    gens: list[Generation | None] = [None] * len(choices.requests)
    events = choices.events()
    try:
        async for index, gen, item in events:
            param = chunks.answer.constraint_param
            if isinstance(item, APIError):
                yield sse_error(named(item, param))
            elif item is None:  # this choice started
                gens[index] = gen
                for chunk in chunks.started(index, gen):
                    yield chunk
            elif item.kind is EventKind.TOKEN and (item.text or item.logprobs):
                for chunk in chunks.token(index, item.text, item.logprobs):
                    yield chunk
            elif item.kind is EventKind.FINISHED:
                for chunk in chunks.token(index, "", final=True):
                    yield chunk
                if item.finish_reason.value == "error":
                    yield sse_error(failed(item, param))
                yield chunks.finished(index, gen)
        if chunks.answer.include_usage:
            yield chunks.answer.sse([], usage(gens))
    except Exception as exc:  # noqa: BLE001 - a bug mid-stream: the client reads an error event, then [DONE]
        yield sse_error(internal_error(exc, f"the stream of {chunks.answer.id}"))
    finally:
        await events.aclose()  # cancels every choice still running (client gone): their requests abort
    yield b"data: [DONE]\n\n"


def chat_streamed(
    choices: Choices, body: ChatCompletionRequest, model: str, tools: ToolReading | None
) -> StreamingResponse:
    answer = _answer(choices, "chatcmpl-", "chat.completion.chunk", model, body.logprobs, body.stream_options, body)
    chunks = _ChatChunks(answer, len(choices.requests), tools)
    return StreamingResponse(_events(choices, chunks), media_type="text/event-stream", headers=_SSE_HEADERS)


def completion_streamed(choices: Choices, body: CompletionRequest, model: str, echo: str | None) -> StreamingResponse:
    want = body.logprobs is not None
    answer = _answer(choices, "cmpl-", "text_completion", model, want, body.stream_options, body)
    chunks = _CompletionChunks(answer, len(choices.requests), echo)
    return StreamingResponse(_events(choices, chunks), media_type="text/event-stream", headers=_SSE_HEADERS)
