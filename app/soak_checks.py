"""How `hearth bench --soak` judges a reply (app/soak_traffic.py sends them): a request's clock and watchdog
(`Call`), the API's error bodies, and the readers of OpenAI's server-sent events and Ollama's NDJSON that say
whether a stream ended complete, with a clear error, or cut off (the statuses: app/soak_traffic.py's docstring)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

ANSWERED, CLEAR_ERROR, LOST, HANG, DISCONNECTED = "answered", "clear_error", "lost", "hang", "disconnected"
FINISH_REASONS = frozenset({"stop", "length", "tool_calls"})
Verdict = tuple[str, str]  # (Outcome.status, Outcome.detail)


class Malformed(Exception):
    """A reply that is not what its API promises: the request is lost."""


class Hang(Exception):
    """The deadline passed before the reply was complete."""


def clip(text: str | bytes, limit: int = 300) -> str:
    """One line of at most `limit` characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return " ".join(text.split())[:limit]


def need(ok: bool, why: str) -> None:
    if not ok:
        raise Malformed(why)


class Call:
    """One request's clock: when it was sent, its deadline, when the first content piece came, and the watchdog
    that shuts the socket of a body still running at the deadline."""

    def __init__(self, deadline_s: float) -> None:
        self.started_s = time.monotonic()
        self.deadline_s = self.started_s + deadline_s  # monotonic
        self.first_s: float | None = None  # monotonic time of the first content piece
        self.expired = False  # the watchdog shut the socket: the error that follows is a hang
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def watch(self, response: httpx.Response) -> None:
        stream = response.extensions.get("network_stream")  # httpcore's, absent under a MockTransport
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return

        def expire() -> None:
            with self._lock:
                if self._timer is None:  # unwatched meanwhile: the socket is back in the pool
                    return
                self.expired = True
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed already

        self._timer = threading.Timer(max(0.0, self.deadline_s - time.monotonic()), expire)
        self._timer.daemon = True
        self._timer.start()

    def unwatch(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def check(self) -> None:
        if time.monotonic() > self.deadline_s:
            raise Hang

    def lines(self, response: httpx.Response) -> Iterator[str]:
        for line in response.iter_lines():
            self.check()
            yield line

    def read(self, response: httpx.Response) -> bytes:
        chunks = []
        for chunk in response.iter_bytes():
            self.check()
            chunks.append(chunk)
        return b"".join(chunks)

    def content(self) -> None:
        if self.first_s is None:
            self.first_s = time.monotonic()


# ---- judging bodies


def json_object(raw: str | bytes, what: str) -> dict:
    try:
        data = json.loads(raw)
    except ValueError:
        raise Malformed(f"{what} is not JSON: {clip(raw)}") from None
    need(isinstance(data, dict), f"{what} is not a JSON object: {clip(raw)}")
    return data


def _error_fields(data: Any, ollama: bool) -> tuple[str, str | None] | None:
    """(message, code) of an error in the API's shape, None when `data` is not one."""
    error = data.get("error") if isinstance(data, dict) else None
    if ollama:
        return (error, None) if isinstance(error, str) and error else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        code = error.get("code")
        return error["message"], code if isinstance(code, str) else None
    return None


def _error_body(raw: bytes, ollama: bool) -> tuple[str, str | None] | None:
    """(message, code) of an error body in the API's shape, None when it is not one."""
    try:
        return _error_fields(json.loads(raw), ollama)
    except ValueError:
        return None


def error_verdict(status: int, raw: bytes, ollama: bool) -> Verdict:
    """A 4xx/5xx: clear when its body is the API's JSON error."""
    found = _error_body(raw, ollama)
    if found is None:
        return LOST, clip(f"HTTP {status} without a JSON error body: {clip(raw, 200)}")
    message, code = found
    return CLEAR_ERROR, clip(f"HTTP {status}{f' {code}' if code else ''}: {message}")


def stream_error(data: dict, ollama: bool) -> Verdict:
    found = _error_fields(data, ollama)
    if found is None:
        raise Malformed(f"an error in the stream without a message: {clip(json.dumps(data))}")
    return CLEAR_ERROR, clip(f"error in the stream: {found[0]}")


def refusal(status: int, raw: bytes, expected: Callable[[int, str | None], bool], what: str) -> Verdict:
    """A request the server must refuse: its refusal is a clear error, anything else lost.  A full queue (429),
    a busy model (503) and a crashed runner are the load's or the chaos's, clear errors whatever was sent."""
    found = None if 200 <= status < 300 else _error_body(raw, ollama=False)
    if found is None:
        return LOST, clip(f"expected {what}, got HTTP {status}: {clip(raw, 200)}")
    message, code = found
    if expected(status, code) or status in (429, 503) or code == "runner_crashed":
        return CLEAR_ERROR, clip(f"HTTP {status}{f' {code}' if code else ''}: {message}")
    return LOST, clip(f"expected {what}, got HTTP {status} {code}: {message}")


def chat_text(choice: dict) -> str:
    message = choice.get("message")
    need(isinstance(message, dict) and message.get("role") == "assistant", "a choice without an assistant message")
    content, calls = message.get("content"), message.get("tool_calls")
    need(isinstance(content, str) or (content is None and bool(calls)), "a message with neither content nor calls")
    return content or ""


def completion_text(choice: dict) -> str:
    need(isinstance(choice.get("text"), str), "a completion choice without text")
    return choice["text"]


def choices_of(data: dict, n: int, text_of: Callable[[dict], str]) -> list[dict]:
    """The n choices of an OpenAI reply in index order, each checked for its text and finish reason."""
    choices = data.get("choices")
    need(isinstance(choices, list) and len(choices) == n, f"expected {n} choice(s): {clip(json.dumps(data))}")
    choices = sorted(choices, key=lambda c: c.get("index", -1))
    for i, choice in enumerate(choices):
        need(choice.get("index") == i, f"choice indices {[c.get('index') for c in choices]}, not 0..{n - 1}")
        need(choice.get("finish_reason") in FINISH_REASONS, f"choice {i} finish_reason {choice['finish_reason']!r}")
        text_of(choice)
    return choices


def ollama_text(data: dict, key: str) -> str:
    """A whole Ollama reply's text (`key`: "message" for /api/chat, "response" for /api/generate)."""
    need(data.get("done") is True and isinstance(data.get("done_reason"), str), "an Ollama reply not done")
    value = data.get(key)
    text = value.get("content") if key == "message" and isinstance(value, dict) else value
    need(isinstance(text, str), f"an Ollama reply without {key}")
    return text


def vectors_ok(vectors: Any, n: int) -> None:
    need(isinstance(vectors, list) and len(vectors) == n, f"expected {n} vectors")
    need(all(isinstance(v, list) and v for v in vectors), "an empty or missing vector")
    need(len({len(v) for v in vectors}) == 1, f"vectors of lengths {[len(v) for v in vectors]}")
    need(all(isinstance(x, (int, float)) for v in vectors for x in v), "a vector component that is no number")


# ---- reading streams


def _sse_piece(choice: dict) -> bool:
    """Whether a chunk's choice carries content (chat text, a tool call, completion text)."""
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls") or choice.get("text"))


def read_sse(call: Call, response: httpx.Response, n: int, *, usage: bool, disconnect: bool = False) -> Verdict:
    """An OpenAI stream to its end: every data line JSON, each of the n choices finished, [DONE] last (and a usage
    chunk when `usage`); with `disconnect`, closed at the first content piece."""
    done, has_usage, finished = False, False, set()
    for line in call.lines(response):
        if not line:
            continue
        need(not done, f"data after [DONE]: {clip(line)}")
        need(line.startswith("data:"), f"not a server-sent data line: {clip(line)}")
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            continue
        chunk = json_object(data, "a data line")
        if "error" in chunk:
            return stream_error(chunk, ollama=False)
        has_usage = has_usage or isinstance(chunk.get("usage"), dict)
        need(isinstance(chunk.get("choices"), list), f"a chunk without choices: {clip(data)}")
        for choice in chunk["choices"]:
            if _sse_piece(choice):
                call.content()
                if disconnect:
                    return DISCONNECTED, ""
            if choice.get("finish_reason") is not None:
                need(choice["finish_reason"] in FINISH_REASONS, f"finish_reason {choice['finish_reason']!r}")
                finished.add(choice.get("index"))
    need(done, "the stream ended without [DONE] (cut off)")
    need(finished == set(range(n)), f"choices {sorted(finished, key=str)} of {n} got a finish_reason")
    need(has_usage or not usage, "no usage chunk, though stream_options.include_usage asked for one")
    return ANSWERED, ""


def _ollama_piece(line: dict, key: str) -> bool:
    """Whether a line carries content (text, thinking or tool calls)."""
    if key == "message":
        message = line.get("message") if isinstance(line.get("message"), dict) else {}
        return bool(message.get("content") or message.get("thinking") or message.get("tool_calls"))
    return bool(line.get(key) or line.get("thinking"))


def read_ndjson(call: Call, response: httpx.Response, key: str) -> Verdict:
    """An Ollama stream to its end: every line JSON, the last `done: true` with a done_reason."""
    last: dict | None = None
    for line in call.lines(response):
        if not line.strip():
            continue
        need(last is None or last.get("done") is not True, f"a line after done: {clip(line)}")
        last = json_object(line, "an NDJSON line")
        if "error" in last:
            return stream_error(last, ollama=True)
        if _ollama_piece(last, key):
            call.content()
    if last is None or last.get("done") is not True:
        raise Malformed("the stream ended without a done line (cut off)")
    ollama_text(last, key)
    return ANSWERED, ""


# ---- the kinds
