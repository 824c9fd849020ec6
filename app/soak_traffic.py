"""The traffic of `hearth bench --soak` (issue 43): requests of every kind `hearth serve` answers, each sent, read
to its end and judged, so that every request of a soak is accounted for.  app/soak.py starts the server, the
chaos and the sampling; this module only talks HTTP.

A kind is a row of `_TABLE` (its name, how it is sent and judged, its priority); KINDS names them all.
`Traffic.run_one` picks one with the caller's rng and returns an `Outcome`, never raising; `drive` runs several
clients, one request after another.

How a reply is judged (Outcome.status):
- answered: a 2xx that is complete and well formed: a JSON body of the API's shape with a finish reason; an
  OpenAI stream whose every `data:` line is JSON, that ends with `[DONE]` and gave each choice a finish_reason;
  an Ollama NDJSON stream whose last line is `done: true` with a `done_reason`;
- clear_error: a 4xx/5xx with the API's JSON error body (OpenAI's {"error": {"message"}}, Ollama's
  {"error": "..."}), or an error event / line in a stream; for the hostile kinds, the refusal they ask for;
- lost: anything else: a non-JSON error body, a malformed or cut-off 2xx, a connection that broke before a
  complete answer, a canary whose text changed, a hostile request given the wrong status;
- hang: no complete response within deadline_s;
- disconnected: the `disconnect` kind closed its stream after the first content piece, as planned.

A hang costs at most about deadline_s: httpx's timeouts bound the wait for the headers, a watchdog shuts the
socket of a body still running at the deadline (a read blocked on a stalled server returns at once), and a
body's pieces are checked against the deadline as they come.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from app.bench_requests import synthetic_texts
from app.server.runner import Limits
from app.soak_checks import (
    ANSWERED,
    HANG,
    LOST,
    Call,
    Hang,
    Malformed,
    Verdict,
    chat_text,
    choices_of,
    clip,
    completion_text,
    error_verdict,
    json_object,
    need,
    ollama_text,
    read_ndjson,
    read_sse,
    refusal,
    vectors_ok,
)

TOKENS_PER_WORD = 1.3  # a plain word costs at most about this many tokens: the near-context prompt under-shoots
NEAR_CONTEXT_MARGIN = 64  # tokens the near-context prompt leaves free (template, max_tokens 8)
NESTED_DEPTH = 100  # hostile_nested's depth, past the server's 64
INTERACTIVE = -10  # openai_priority's priority, the interactive class (its ttft is counted apart)
CANARY = "1, 2, 3, 4, 5, 6, 7, 8,"  # the canary counts on (see Traffic._canary)
QUESTIONS = ("Name a colour.", "What is 2 + 2?", "Say hello in French.", "Name a fruit.", "Spell cat.")
PROMPTS = ("The capital of France is", "Once upon a time", "One, two, three,", "The sky is")
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
PERSON = {  # openai_json_schema's schema: a reply that stopped must parse and hold both keys
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass(frozen=True)
class Outcome:
    """What became of one request."""

    kind: str  # the request kind (one of KINDS)
    status: str  # "answered" | "clear_error" | "lost" | "hang" | "disconnected"
    priority: int  # the request's priority (0 when the kind sets none)
    ttft_s: float | None  # streamed kinds: seconds from sending to the first content piece; else None
    latency_s: float  # sending to the end of the response
    detail: str  # "" when answered; the error message (clear_error) or why it is lost / hung, one line
    started_s: float  # time.monotonic() when it was sent


class Traffic:
    """Sends one request of a kind at a time to the server at `base_url` (thread-safe: one Traffic serves every
    client of `drive`).  `n_ctx` is the served context (the near-context and too-long prompts are sized from it);
    `embeddings` False leaves out the embedding kinds, `kinds` picks a subset of KINDS (default all); `transport`
    replaces the network (tests)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        n_ctx: int,
        *,
        deadline_s: float = 120.0,
        embeddings: bool = True,
        kinds: tuple[str, ...] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        kinds = KINDS if kinds is None else kinds
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown soak request kind(s) {unknown}: the kinds are {', '.join(KINDS)}")
        self.model, self.n_ctx, self.deadline_s = model, n_ctx, deadline_s
        self.kinds = tuple(k for k in _TABLE if k.name in kinds and (embeddings or not k.embeddings))
        if not self.kinds:
            raise ValueError(f"no soak request kind left of {list(kinds)} (embeddings={embeddings})")
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.Client(base_url=base_url, timeout=deadline_s, limits=limits, transport=transport)
        self._canary_lock = threading.Lock()
        self._canary_text: str | None = None  # the first answered canary's text

    def close(self) -> None:
        self._client.close()

    def run_one(self, rng: random.Random) -> Outcome:
        """Picks a kind with `rng`, sends it, reads and judges the reply; never raises."""
        kind = rng.choice(self.kinds)
        call = Call(self.deadline_s)
        status, detail = self._judge(kind, rng, call)
        ttft_s = call.first_s - call.started_s if call.first_s is not None else None
        latency_s = time.monotonic() - call.started_s
        return Outcome(kind.name, status, kind.priority, ttft_s, latency_s, detail, call.started_s)

    def _judge(self, kind: _Kind, rng: random.Random, call: Call) -> Verdict:
        try:
            return kind.send(self, rng, call)
        except Malformed as exc:
            return LOST, clip(str(exc))
        except (Hang, httpx.TimeoutException):
            return HANG, f"no complete response within {self.deadline_s:g} s"
        except httpx.TransportError as exc:
            if call.expired:
                return HANG, f"no complete response within {self.deadline_s:g} s (the watchdog closed it)"
            return LOST, clip(f"the connection failed before a complete answer: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - run_one never raises: whatever went wrong, the request is lost
            return LOST, clip(f"{type(exc).__name__}: {exc}")

    # -- the wire

    @contextmanager
    def _open(self, call: Call, path: str, body: dict | None, content: bytes | None) -> Iterator[httpx.Response]:
        headers = {"content-type": "application/json"} if content is not None else None
        with self._client.stream("POST", path, json=body, content=content, headers=headers) as response:
            call.watch(response)
            try:
                yield response
            finally:
                call.unwatch()

    def _exchange(
        self, call: Call, path: str, body: dict | None = None, content: bytes | None = None
    ) -> tuple[int, bytes]:
        """(status, body bytes) of a request read to its end."""
        with self._open(call, path, body, content) as response:
            return response.status_code, call.read(response)

    def _answer(self, call: Call, path: str, body: dict, check: Callable[[dict], Any]) -> Verdict:
        """A non-stream request: a 2xx must pass `check` (which raises Malformed), an error be clear."""
        status, raw = self._exchange(call, path, body)
        if not 200 <= status < 300:
            return error_verdict(status, raw, ollama=path.startswith("/api/"))
        check(json_object(raw, f"a {status} body"))
        return ANSWERED, ""

    def _stream(self, call: Call, path: str, body: dict, read: Callable[[httpx.Response], Verdict]) -> Verdict:
        with self._open(call, path, body, None) as response:
            if not 200 <= response.status_code < 300:
                return error_verdict(response.status_code, call.read(response), ollama=path.startswith("/api/"))
            return read(response)

    # -- bodies

    def _chat(self, rng: random.Random, question: str | None = None, **extra: Any) -> dict:
        messages = [{"role": "user", "content": question or rng.choice(QUESTIONS)}]
        return {"model": self.model, "messages": messages, "max_tokens": rng.randint(8, 24), **extra}

    def _completion(self, rng: random.Random, **extra: Any) -> dict:
        return {"model": self.model, "prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 24), **extra}

    def _ollama(self, rng: random.Random, chat: bool, stream: bool) -> dict:
        body = {"model": self.model, "stream": stream, "options": {"num_predict": rng.randint(8, 24)}}
        if chat:
            return {**body, "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}]}
        return {**body, "prompt": rng.choice(QUESTIONS)}

    def _words(self, rng: random.Random, n: int) -> str:
        return synthetic_texts(1, n, rng.randrange(1 << 30))[0]

    # -- one method per kind: (status, detail)

    def _openai_chat(self, rng: random.Random, call: Call) -> Verdict:
        return self._answer(call, CHAT, self._chat(rng), lambda d: choices_of(d, 1, chat_text))

    def _openai_chat_stream(self, rng: random.Random, call: Call, **extra: Any) -> Verdict:
        body = self._chat(rng, stream=True, stream_options={"include_usage": True}, **extra)
        return self._stream(call, CHAT, body, lambda r: read_sse(call, r, 1, usage=True))

    def _openai_completion(self, rng: random.Random, call: Call) -> Verdict:
        return self._answer(call, COMPLETIONS, self._completion(rng), lambda d: choices_of(d, 1, completion_text))

    def _openai_completion_stream(self, rng: random.Random, call: Call) -> Verdict:
        body = self._completion(rng, stream=True)
        return self._stream(call, COMPLETIONS, body, lambda r: read_sse(call, r, 1, usage=False))

    def _openai_json_schema(self, rng: random.Random, call: Call) -> Verdict:
        schema = {"name": "person", "schema": PERSON, "strict": True}
        body = self._chat(
            rng, "Describe a person as JSON.", response_format={"type": "json_schema", "json_schema": schema}
        )

        def check(data: dict) -> None:
            choice = choices_of(data, 1, chat_text)[0]
            if choice["finish_reason"] != "length":  # cut by max_tokens: a prefix of a valid reply
                reply = json_object(chat_text(choice), "a json_schema reply")
                need(set(PERSON["required"]) <= set(reply), f"a json_schema reply without its keys: {reply}")

        return self._answer(call, CHAT, body, check)

    def _openai_tools(self, rng: random.Random, call: Call) -> Verdict:
        body = self._chat(rng, "What is the weather in Paris?", tools=[WEATHER_TOOL])

        def check(data: dict) -> None:
            choice = choices_of(data, 1, chat_text)[0]
            calls = choice["message"].get("tool_calls") or []
            need(
                bool(calls) == (choice["finish_reason"] == "tool_calls") or choice["finish_reason"] == "length",
                f"finish_reason {choice['finish_reason']!r} with {len(calls)} tool call(s)",
            )
            for c in calls:
                function = c.get("function") or {}
                need(function.get("name") == "get_weather", f"a call of an unknown function: {clip(json.dumps(c))}")
                if choice["finish_reason"] == "tool_calls":
                    json_object(function.get("arguments"), "a tool call's arguments")

        return self._answer(call, CHAT, body, check)

    def _openai_n2(self, rng: random.Random, call: Call) -> Verdict:
        body = self._chat(rng, n=2, temperature=0.8)
        return self._answer(call, CHAT, body, lambda d: choices_of(d, 2, chat_text))

    def _openai_logprobs(self, rng: random.Random, call: Call) -> Verdict:
        def check(data: dict) -> None:
            logprobs = choices_of(data, 1, chat_text)[0].get("logprobs") or {}
            entries = logprobs.get("content")
            need(isinstance(entries, list), "no logprobs.content, though logprobs was asked for")
            for e in entries:
                need(isinstance(e.get("logprob"), (int, float)), f"a logprob entry without logprob: {clip(str(e))}")
                need(len(e.get("top_logprobs") or ()) == 2, f"top_logprobs of {e.get('top_logprobs')!r}, not 2")

        return self._answer(call, CHAT, self._chat(rng, logprobs=True, top_logprobs=2), check)

    def _openai_priority(self, rng: random.Random, call: Call) -> Verdict:
        return self._openai_chat_stream(rng, call, priority=INTERACTIVE)

    def _openai_embeddings(self, rng: random.Random, call: Call) -> Verdict:
        body = {"model": self.model, "input": rng.sample(QUESTIONS, 2)}
        return self._answer(call, EMBEDDINGS, body, lambda d: vectors_ok([e.get("embedding") for e in d["data"]], 2))

    def _ollama_embed(self, rng: random.Random, call: Call) -> Verdict:
        body = {"model": self.model, "input": rng.sample(QUESTIONS, 2)}
        return self._answer(call, "/api/embed", body, lambda d: vectors_ok(d.get("embeddings"), 2))

    def _ollama_chat(self, rng: random.Random, call: Call) -> Verdict:
        return self._answer(call, "/api/chat", self._ollama(rng, True, False), lambda d: ollama_text(d, "message"))

    def _ollama_chat_stream(self, rng: random.Random, call: Call) -> Verdict:
        body = self._ollama(rng, True, True)
        return self._stream(call, "/api/chat", body, lambda r: read_ndjson(call, r, "message"))

    def _ollama_generate_stream(self, rng: random.Random, call: Call) -> Verdict:
        body = self._ollama(rng, False, True)
        return self._stream(call, "/api/generate", body, lambda r: read_ndjson(call, r, "response"))

    def _disconnect(self, rng: random.Random, call: Call) -> Verdict:
        body = {**self._chat(rng, stream=True), "max_tokens": 32}
        return self._stream(call, CHAT, body, lambda r: read_sse(call, r, 1, usage=False, disconnect=True))

    def _near_context(self, rng: random.Random, call: Call) -> Verdict:
        words = max(1, int((self.n_ctx - NEAR_CONTEXT_MARGIN) / TOKENS_PER_WORD))
        body = {"model": self.model, "prompt": self._words(rng, words), "max_tokens": 8}
        status, raw = self._exchange(call, COMPLETIONS, body)
        if 200 <= status < 300:
            choices_of(json_object(raw, f"a {status} body"), 1, completion_text)
            return ANSWERED, ""
        overflow = "a 400 context_length_exceeded"
        return refusal(status, raw, lambda s, code: s == 400 and code == "context_length_exceeded", overflow)

    def _too_long(self, rng: random.Random, call: Call) -> Verdict:
        body = self._chat(rng, self._words(rng, 2 * self.n_ctx))
        status, raw = self._exchange(call, CHAT, body)
        return refusal(status, raw, lambda s, code: 400 <= s < 500, "a 4xx")

    def _hostile_oversized(self, rng: random.Random, call: Call) -> Verdict:
        text = b"a" * (Limits().max_body_bytes + 1024)
        content = b'{"model": %s, "messages": [{"role": "user", "content": "%s"}]}' % (
            json.dumps(self.model).encode(),
            text,
        )
        status, raw = self._exchange(call, CHAT, content=content)
        return refusal(status, raw, lambda s, code: s == 413, "a 413")

    def _hostile_malformed(self, rng: random.Random, call: Call) -> Verdict:
        content = b'{"model": %s, "messages": [{"role": "user", "content": "hi"' % json.dumps(self.model).encode()
        status, raw = self._exchange(call, CHAT, content=content)
        return refusal(status, raw, lambda s, code: s == 400, "a 400")

    def _hostile_nested(self, rng: random.Random, call: Call) -> Verdict:
        body = json.dumps(self._chat(rng))[:-1] + ', "x_nested": ' + "[" * NESTED_DEPTH + "]" * NESTED_DEPTH + "}"
        status, raw = self._exchange(call, CHAT, content=body.encode())
        return refusal(status, raw, lambda s, code: s == 400, "a 400")

    def _canary(self, rng: random.Random, call: Call) -> Verdict:
        """Greedy, so every answer has the first one's text: a token duplicated or dropped by a request replayed
        after a runner crash shows here.  Counting, because its next token wins by a wide margin: a question's
        first token can be a near-tie (the starter's "The capital ..." against "L'Étoile ...") that the torch
        engine's bf16 logits tip either way with the batch around it, which is rounding, not a lost token."""
        body = {"model": self.model, "prompt": CANARY, "max_tokens": 12, "temperature": 0, "seed": 0}
        status, raw = self._exchange(call, COMPLETIONS, body)
        if not 200 <= status < 300:
            return error_verdict(status, raw, ollama=False)
        text = completion_text(choices_of(json_object(raw, f"a {status} body"), 1, completion_text)[0])
        with self._canary_lock:
            if self._canary_text is None:
                self._canary_text = text
            first = self._canary_text
        if text != first:
            return LOST, clip(f"canary text differs: {text!r}, the first was {first!r}")
        return ANSWERED, ""


class _Kind(NamedTuple):
    name: str
    send: Callable[[Traffic, random.Random, Call], Verdict]  # sends one request of the kind and judges its reply
    priority: int = 0  # the request's priority
    embeddings: bool = False  # sent only when the server computes embeddings


_TABLE: tuple[_Kind, ...] = (
    _Kind("openai_chat", Traffic._openai_chat),  # a whole chat reply
    _Kind("openai_chat_stream", Traffic._openai_chat_stream),  # a stream with a usage chunk
    _Kind("openai_completion", Traffic._openai_completion),
    _Kind("openai_completion_stream", Traffic._openai_completion_stream),
    _Kind("openai_json_schema", Traffic._openai_json_schema),  # a stopped reply parses, with the required keys
    _Kind("openai_tools", Traffic._openai_tools),  # a call of the one function, or text
    _Kind("openai_n2", Traffic._openai_n2),  # choices 0 and 1
    _Kind("openai_logprobs", Traffic._openai_logprobs),  # each token's logprob and 2 top entries
    _Kind("openai_priority", Traffic._openai_priority, priority=INTERACTIVE),  # a stream at the interactive priority
    _Kind("openai_embeddings", Traffic._openai_embeddings, embeddings=True),  # vectors of one length
    _Kind("ollama_embed", Traffic._ollama_embed, embeddings=True),
    _Kind("ollama_chat", Traffic._ollama_chat),
    _Kind("ollama_chat_stream", Traffic._ollama_chat_stream),
    _Kind("ollama_generate_stream", Traffic._ollama_generate_stream),
    _Kind("disconnect", Traffic._disconnect),  # closed after its first content piece
    _Kind("near_context", Traffic._near_context),  # answered, or a 400 context_length_exceeded
    _Kind("too_long", Traffic._too_long),  # twice the context: a 4xx
    _Kind("hostile_oversized", Traffic._hostile_oversized),  # over the body limit: a 413
    _Kind("hostile_malformed", Traffic._hostile_malformed),  # invalid JSON: a 400
    _Kind("hostile_nested", Traffic._hostile_nested),  # 100 levels deep in an unknown field: a 400
    _Kind("canary", Traffic._canary),  # greedy: the same text every time
)
KINDS: tuple[str, ...] = tuple(kind.name for kind in _TABLE)  # every request kind, in the table's order


def drive(
    traffic: Traffic, clients: int, duration_s: float, seed: int, stop: threading.Event | None = None
) -> list[Outcome]:
    """`clients` threads each sending one request after another (rng seeded seed + client index) until duration_s
    passed (or stop is set); every outcome, in completion order.  A request in flight at the end is finished."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    end_s = time.monotonic() + duration_s
    stop = threading.Event() if stop is None else stop

    def client(index: int) -> None:
        rng = random.Random(seed + index)
        while time.monotonic() < end_s and not stop.is_set():
            outcome = traffic.run_one(rng)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(i,), name=f"soak-client-{i}", daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
