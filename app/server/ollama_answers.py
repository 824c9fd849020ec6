"""Ollama's answers to /api/chat and /api/generate: Ollama's wire format as one more strategy over the answering
loops the OpenAI routes use (app/server/answers.py: `collect` for a whole reply, `drain` for a stream), so the
events, a failed generation's error (answers.failed), a refused or broken stream's, and the abort of a client that
left are handled once for both APIs; only the framing is Ollama's:
- a stream is NDJSON (one JSON object a line): `message` (chat) or `response` (generate) pieces with `done:
  false`, then a last line with `done: true`, `done_reason` and the counters in nanoseconds (total_duration,
  load_duration, prompt_eval_count, prompt_eval_duration, eval_count, eval_duration);
- a whole reply is that last line with the whole text;
- an error is `{"error": "..."}`: the body of a 4xx/5xx, or a stream's last line (no done line after it);
- a reply that starts with <think>...</think> has it as `thinking` when `think` was asked (app/server/think.py);
- tool calls are `message.tool_calls: [{"function": {"name", "arguments": {...}}}]`, arguments as an object;
- with `logprobs: true`, a line carries `logprobs`: [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}, ...]}, ...] for the tokens since the line before (Ollama 0.12.11's shape, which the official
  client reads; tokens whose text the think splitter or the tool-call parser held go on the next line written),
  and a whole reply has every token's on its one line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.server.answers import collect, drain, finish_reason, open_choices, stats_of
from app.server.choices import Choices
from app.server.errors import APIError
from app.server.logprobs import chat_content
from app.server.ollama_models import timestamp
from app.server.runner import Generation, Runner
from app.server.think import ThinkSplitter
from app.server.tool_replies import ToolReply
from backends.api import Request, TokenLogprob
from backends.tools.render import ToolReading

_NDJSON = "application/x-ndjson"


def ollama_error(err: APIError) -> JSONResponse:
    """Ollama's error body: {"error": message}."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


def ollama_stream_error(err: APIError) -> bytes:
    """The error line of an NDJSON stream, Ollama's way (its client raises ResponseError on it)."""
    return (json.dumps({"error": err.message}) + "\n").encode()


def ns(seconds: float) -> int:
    """Seconds as Ollama's durations: whole nanoseconds, never negative."""
    return max(int(seconds * 1e9), 0)


def loaded_reply(served: str, chat: bool, stream: bool, reason: str) -> Response:
    """The answer to a request without a prompt: its done line, done_reason "load" or "unload"."""
    line: dict[str, Any] = {"model": served, "created_at": timestamp(time.time()), "done": True, "done_reason": reason}
    line.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return Response(json.dumps(line) + "\n", media_type=_NDJSON) if stream else JSONResponse(line)


def counters(gen: Generation, total_s: float, load_s: float) -> dict[str, Any]:
    """The last line's fields: done, done_reason and Ollama's counters."""
    stats = stats_of(gen)
    prefill = max((stats.ttft_s - stats.queue_s) if stats else 0.0, 0.0)
    return {
        "done": True,
        "done_reason": finish_reason(gen),
        "total_duration": ns(total_s),
        "load_duration": ns(load_s),  # 0 unless keep_alive had unloaded it
        "prompt_eval_count": stats.prompt_tokens if stats else 0,
        "prompt_eval_duration": ns(prefill),
        "eval_count": stats.completion_tokens if stats else 0,
        "eval_duration": ns(stats.decode_s if stats else 0.0),
    }


def _tool_calls(reply: ToolReply) -> list[dict]:
    """The reply's calls, Ollama's way: arguments as an object (as the text when it is no JSON)."""
    out = []
    for k, call in enumerate(reply.parser.calls):
        try:
            args: Any = json.loads(call.arguments) if call.arguments else {}
        except ValueError:
            args = call.arguments
        out.append({"id": call.id, "function": {"index": k, "name": call.name, "arguments": args}})
    return out


def _ndjson(line: dict) -> bytes:
    return (json.dumps(line) + "\n").encode()


class OllamaLines:
    """Ollama's framing (answers.Chunks) of one choice: its text through the think splitter and, with tools, the
    tool-call parser (which holds call text until it is known), as `message` or `response` lines; the counters on
    the last one.  A streamed reply writes a line a piece; a collected one (`whole`) feeds the same pieces and
    writes one line."""

    def __init__(
        self,
        served: str,
        *,
        chat: bool,
        tools: ToolReading | None,
        think: bool,
        param: str | None,
        where: str,
        arrived: float,
        load_s: float,
        logprobs: bool = False,
    ) -> None:
        self.served, self.chat = served, chat
        self.logprobs = logprobs  # the request asked for them
        self.held: list[TokenLogprob] = []  # entries of tokens not yet on a line
        self.param, self.where = param, where  # the field a constraint's errors name; what a bug's error names
        self.arrived, self.load_s = arrived, load_s  # perf_counter() when the request came; keep_alive's load
        self.reply = ToolReply(tools) if tools is not None else None
        self.splitter = ThinkSplitter(think)

    def _line(self, text: str, thinking: str, calls: list[dict] | None = None, final: dict | None = None) -> dict:
        out: dict[str, Any] = {"model": self.served, "created_at": timestamp(time.time())}
        if self.chat:
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
        if self.logprobs:
            out["logprobs"], self.held = chat_content(self.held), []
        out.update(final or {"done": False})
        return out

    def _pieces(self, text: str) -> tuple[str, str]:
        """(thinking, visible text) of the next piece; tool-call text is held by the parser until it is known."""
        thinking, content = self.splitter.feed(text)
        if self.reply is not None and content:
            content = "".join(d.get("content", "") for d in self.reply.feed(content))
        return thinking, content

    def _closing(self) -> tuple[str, str, list[dict] | None]:
        """What the splitter and the parser held at the reply's end, and the reply's calls."""
        thinking, content = self.splitter.flush()
        calls = None
        if self.reply is not None:
            content = "".join(d.get("content", "") for d in self.reply.feed(content) + self.reply.finish())
            calls = _tool_calls(self.reply) or None
        return thinking, content, calls

    def _done(self, gen: Generation) -> dict[str, Any]:
        return counters(gen, time.perf_counter() - self.arrived + self.load_s, self.load_s)

    def whole(self, pieces: list[str], gen: Generation, entries: list[TokenLogprob] | None = None) -> dict:
        """The collected reply: its TOKEN texts fed one by one as in a stream, written as one line (with every
        token's logprob entry when asked)."""
        self.held = list(entries or ())
        thinking, content = [], []
        for text in pieces:
            if text:
                th, piece = self._pieces(text)
                thinking.append(th)
                content.append(piece)
        th, piece, calls = self._closing()
        return self._line("".join(content) + piece, "".join(thinking) + th, calls, self._done(gen))

    # -- answers.Chunks: the stream's lines ---------------------------------------------------------------------
    def started(self, index: int, gen: Generation) -> list[bytes]:
        return []  # Ollama has no opening line: the first piece of text is the first line

    def token(self, index: int, text: str, entries: tuple = (), final: bool = False) -> list[bytes]:
        self.held.extend(entries)
        if final:
            thinking, content, calls = self._closing()
        elif text:
            (thinking, content), calls = self._pieces(text), None
        else:
            return []
        return [_ndjson(self._line(content, thinking, calls))] if thinking or content or calls else []

    def finished(self, index: int, gen: Generation, failure: APIError | None) -> list[bytes]:
        if failure is not None:  # the error line ends the stream: no done line after it
            return [ollama_stream_error(failure)]
        return [_ndjson(self._line("", "", None, self._done(gen)))]

    def error(self, err: APIError) -> bytes:
        return ollama_stream_error(err)

    def ended(self, gens: list[Generation | None]) -> list[bytes]:
        return []  # the done line closed the one choice already

    def closing(self) -> list[bytes]:
        return []


async def ollama_answer(
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
    """The answer to /api/chat's or /api/generate's `req` (one choice: Ollama has no `n`): admitted first (its
    errors are the HTTP status: a prompt too long, a full queue), then collected or streamed by answers.py's loops
    in Ollama's framing.  `load_s`: how long keep_alive's load took (load_duration)."""
    arrived = time.perf_counter()
    param = "format" if req.constraint is not None else None  # the field a constraint's errors name
    choices = Choices(runner, [req])
    await open_choices(choices, param)
    lines = OllamaLines(
        served,
        chat=chat,
        tools=tools,
        think=think,
        param=param,
        where=req.request_id,
        arrived=arrived,
        load_s=load_s,
        logprobs=req.sampling.logprobs is not None,
    )
    if stream:
        return StreamingResponse(drain(choices, lines), media_type=_NDJSON)

    async def respond() -> Response:
        got = await collect(choices, prompt_logprobs=False, param=param)
        return JSONResponse(lines.whole(got.pieces[0], got.gens[0], got.logprobs[0]))

    return await unless_gone(request, respond())  # a client that leaves aborts the request (a 499)
