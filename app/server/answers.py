"""The answer to one generation request, once its choices are admitted: one loop per seam, collected (one body
once every choice has finished: `collect`) and streamed (chunks as tokens arrive: `drain`), and one framing
strategy per wire format.  OpenAI's chat and completion chunks (server-sent events) live here; Ollama's NDJSON
lines are one more strategy over the same loops (app/server/ollama_answers.py).  Both APIs share what happens
between the events and the wire: a failed generation's error (`failed`), a refused later choice's, a bug's
mid-stream (an error chunk in the API's framing, then the stream's own end).

Each loop drains `Choices.events()` (app/server/choices.py): (index, Generation, None) when a choice starts,
(index, Generation, event) for its TOKEN and FINISHED events, (index, None, APIError) when a later choice is
refused.  `Answer` carries what every choice of one OpenAI answer shares (id, object, created, model, logprobs
wanted).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from fastapi.responses import JSONResponse, StreamingResponse

from app.server.choices import Choices
from app.server.errors import APIError, internal_error
from app.server.logprobs import CompletionLogprobs, chat_logprobs
from app.server.response_format import constraint_param, limit_error, named
from app.server.runner import Generation
from app.server.schemas import ChatCompletionRequest, CompletionRequest, StreamOptions
from app.server.tool_replies import ToolReply
from backends.api import EventKind, GenerationEvent, RequestStats, TokenLogprob
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


async def open_choices(choices: Choices, param: str | None) -> None:
    """Admit and start choice 0 (its errors, a prompt too long or a full queue, are the HTTP status); a
    ConstraintError the backend raised compiling for its vocabulary is the 400 of `param`, the field the schema
    came from (response_format.named)."""
    try:
        await choices.open()
    except APIError as exc:
        raise named(exc, param) from None


def stats_of(gen: Generation) -> RequestStats | None:
    """A generation's numbers: FINISHED's when it has them, else STARTED's (the prompt's alone)."""
    return gen.finished.stats if gen.finished and gen.finished.stats else gen.started.stats


def usage(gens: list[Generation | None]) -> dict:
    """The prompt counts once (every choice has the same prompt); completions add up over the choices."""
    p = c = 0
    for i, gen in enumerate(gens):
        if gen is None:
            continue
        stats = stats_of(gen)
        if stats is not None:
            p = stats.prompt_tokens if i == 0 else p
            c += stats.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def finish_reason(gen: Generation) -> str:
    """The reason both APIs report: "stop" or "length" (an aborted or failed generation reads "stop")."""
    reason = gen.finished.finish_reason.value if gen.finished else "abort"
    return reason if reason in ("stop", "length") else "stop"


def failed(event: GenerationEvent, param: str | None = None) -> APIError:
    """The error of a reply that ended with FinishReason.ERROR, on both APIs: a 400 when its constraint hit
    llguidance's limits (the schema's fault: app/server/response_format.limit_error), else a 500."""
    limit = limit_error(event, param)
    if limit is not None:
        return limit
    return APIError(500, f"generation failed: {event.error}", type="server_error", code=event.error_code)


# ---- collected: one JSON body once every choice has finished


@dataclass
class Collected:
    """Every choice's generation, its TOKEN texts as they came, and its logprob entries."""

    gens: list[Generation | None]
    pieces: list[list[str]]  # each TOKEN's text: a parser fed them one by one sees what a stream would
    logprobs: list[list[TokenLogprob]]

    @property
    def texts(self) -> list[str]:
        return ["".join(p) for p in self.pieces]


async def collect(choices: Choices, prompt_logprobs: bool, param: str | None) -> Collected:
    """The one collected loop of both APIs: every choice's texts and logprob entries; a refused choice or a failed
    generation raises its APIError (`failed`'s), which the route writes in its API's shape."""
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
    return Collected(gens, texts, logprobs)


async def chat_collected(
    choices: Choices, body: ChatCompletionRequest, model: str, tools: ToolReading | None
) -> JSONResponse:
    answer = _answer(choices, "chatcmpl-", "chat.completion", model, body.logprobs, None, body)
    got = await collect(choices, prompt_logprobs=False, param=answer.constraint_param)
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
    got = await collect(choices, prompt_logprobs=echo is not None and want, param=answer.constraint_param)
    out = []
    for i, gen in enumerate(got.gens):
        choice: dict = {"index": i, "finish_reason": finish_reason(gen), "logprobs": None}
        choice["text"] = (echo or "") + got.texts[i]
        if want:
            choice["logprobs"] = CompletionLogprobs().part(got.logprobs[i])
        out.append(choice)
    return JSONResponse({**answer.body(out), "usage": usage(got.gens)})


# ---- streamed: chunks as tokens arrive, interleaved over choices (each chunk names its index)


class Chunks(Protocol):
    """One wire format's framing of `drain`'s loop, OpenAI's (below: server-sent events) or Ollama's
    (app/server/ollama_answers.py: NDJSON lines): the chunks of a choice that `started`, of a TOKEN's text and
    logprob entries (`final`: the choice finished, release what is held back), of a choice that `finished`
    (`failure`: its error when the generation failed, `failed`'s), of an `error` in the stream, once every choice
    has `ended` (OpenAI's usage), and the `closing` ones written even after an error (OpenAI's [DONE])."""

    param: str | None  # the field a constraint's errors name (response_format.constraint_param)
    where: str  # what a bug's error says it happened in: "the stream of <where>"

    def started(self, index: int, gen: Generation) -> list[bytes]: ...

    def token(self, index: int, text: str, entries: tuple = (), final: bool = False) -> list[bytes]: ...

    def finished(self, index: int, gen: Generation, failure: APIError | None) -> list[bytes]: ...

    def error(self, err: APIError) -> bytes: ...

    def ended(self, gens: list[Generation | None]) -> list[bytes]: ...

    def closing(self) -> list[bytes]: ...


async def drain(choices: Choices, chunks: Chunks) -> AsyncIterator[bytes]:
    """The one streamed loop of both APIs: every choice's events through `chunks`, as they come.  A refused later
    choice and a failed generation are error chunks in the stream's framing; so is a bug mid-stream, and the
    stream then ends as it always does (never a cut: the clients raise on the error)."""
    gens: list[Generation | None] = [None] * len(choices.requests)
    events = choices.events()
    try:
        async for index, gen, item in events:
            if isinstance(item, APIError):
                yield chunks.error(named(item, chunks.param))
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
                failure = failed(item, chunks.param) if item.finish_reason.value == "error" else None
                for chunk in chunks.finished(index, gen, failure):
                    yield chunk
        for chunk in chunks.ended(gens):
            yield chunk
    except Exception as exc:  # noqa: BLE001 - a bug mid-stream: the client reads an error chunk, then the end
        yield chunks.error(internal_error(exc, f"the stream of {chunks.where}"))
    finally:
        await events.aclose()  # cancels every choice still running (client gone): their requests abort
    for chunk in chunks.closing():
        yield chunk


class _SSEChunks:
    """OpenAI's framing, what chat and completion chunks share: server-sent events, an error event (then the
    choice's last chunk all the same), the usage chunk when stream_options asks for it, then [DONE]."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.param = answer.constraint_param
        self.where = answer.id

    def _last(self, index: int, gen: Generation) -> dict:
        raise NotImplementedError

    def finished(self, index: int, gen: Generation, failure: APIError | None) -> list[bytes]:
        out = [sse_error(failure)] if failure is not None else []
        return [*out, self.answer.sse([self._last(index, gen)])]

    def error(self, err: APIError) -> bytes:
        return sse_error(err)

    def ended(self, gens: list[Generation | None]) -> list[bytes]:
        return [self.answer.sse([], usage(gens))] if self.answer.include_usage else []

    def closing(self) -> list[bytes]:
        return [b"data: [DONE]\n\n"]


class _ChatChunks(_SSEChunks):
    """Chat chunks: a first delta with the role, content deltas (or, with tools, the ToolReply's deltas), a
    last one with the finish reason."""

    def __init__(self, answer: Answer, n: int, tools: ToolReading | None) -> None:
        super().__init__(answer)
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

    def _last(self, index: int, gen: Generation) -> dict:
        finish, reply = finish_reason(gen), self.replies[index]
        if reply is not None:
            finish = reply.finish_reason(finish)
        return self._choice(index, None, finish)


class _CompletionChunks(_SSEChunks):
    """Completion chunks: the echoed prompt first (with its logprobs when asked), then text pieces, then the
    finish reason.  Logprob text offsets run on per choice."""

    def __init__(self, answer: Answer, n: int, echo: str | None) -> None:
        super().__init__(answer)
        self.echo = echo
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

    def _last(self, index: int, gen: Generation) -> dict:
        return self._choice(index, None, finish_reason(gen))


def chat_streamed(
    choices: Choices, body: ChatCompletionRequest, model: str, tools: ToolReading | None
) -> StreamingResponse:
    answer = _answer(choices, "chatcmpl-", "chat.completion.chunk", model, body.logprobs, body.stream_options, body)
    chunks = _ChatChunks(answer, len(choices.requests), tools)
    return StreamingResponse(drain(choices, chunks), media_type="text/event-stream", headers=_SSE_HEADERS)


def completion_streamed(choices: Choices, body: CompletionRequest, model: str, echo: str | None) -> StreamingResponse:
    want = body.logprobs is not None
    answer = _answer(choices, "cmpl-", "text_completion", model, want, body.stream_options, body)
    chunks = _CompletionChunks(answer, len(choices.requests), echo)
    return StreamingResponse(drain(choices, chunks), media_type="text/event-stream", headers=_SSE_HEADERS)
