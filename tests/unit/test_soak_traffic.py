"""app/soak_traffic.py's judging, without a model: canned replies through httpx.MockTransport (and one real socket
for the watchdog, one live fake-backend server for the whole loop)."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from app.server.background import BackgroundServer
from app.soak_traffic import KINDS, Outcome, Traffic, drive
from tests.fakes import loaded_fake

Handler = Callable[[httpx.Request], httpx.Response]
OK = {"answered", "clear_error", "disconnected"}


def _traffic(handler: Handler, *kinds: str, deadline_s: float = 5.0, n_ctx: int = 64) -> Traffic:
    transport = httpx.MockTransport(handler)
    return Traffic("http://soak.test", "m", n_ctx, deadline_s=deadline_s, kinds=kinds or KINDS, transport=transport)


def _one(handler: Handler, kind: str, **kw: float) -> Outcome:
    outcome = _traffic(handler, kind, **kw).run_one(random.Random(0))
    assert outcome.kind == kind
    return outcome


def _sse(*events: dict | str) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


def _chunk(text: str | None = None, finish: str | None = None, index: int = 0) -> dict:
    delta = {"content": text} if text else {}
    return {"object": "chat.completion.chunk", "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


USAGE = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
GOOD_STREAM = _sse(_chunk("Hel"), _chunk("lo"), _chunk(None, "stop"), USAGE, "[DONE]")


def _reply(content: bytes, status: int = 200, kind: str = "application/json") -> Handler:
    return lambda request: httpx.Response(status, content=content, headers={"content-type": kind})


def _chat_reply(*texts: str, finish: str | None = "stop") -> dict:
    choices = [
        {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": finish}
        for i, t in enumerate(texts)
    ]
    return {"object": "chat.completion", "choices": choices}


# ---- OpenAI streams


def test_a_complete_stream_is_answered_with_its_ttft() -> None:
    outcome = _one(_reply(GOOD_STREAM, kind="text/event-stream"), "openai_chat_stream")
    assert (outcome.status, outcome.detail, outcome.priority) == ("answered", "", 0)
    assert outcome.ttft_s is not None and 0 <= outcome.ttft_s <= outcome.latency_s


def test_the_priority_kind_carries_its_priority() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=GOOD_STREAM)

    outcome = _one(handler, "openai_priority")
    assert (outcome.status, outcome.priority, seen[0]["priority"], seen[0]["stream"]) == ("answered", -10, -10, True)


def test_a_stream_cut_off_before_done_is_lost() -> None:
    outcome = _one(_reply(_sse(_chunk("Hel"), _chunk(None, "stop"), USAGE)), "openai_chat_stream")
    assert outcome.status == "lost" and "[DONE]" in outcome.detail


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_sse(_chunk("Hi"), "[DONE]"), "finish_reason"),  # the choice never finished
        (_sse(_chunk("Hi"), _chunk(None, "stop"), "[DONE]"), "usage"),  # include_usage asked for one
        (_sse(_chunk("Hi"), "{not json", "[DONE]"), "not JSON"),
        (_sse(_chunk("Hi"), _chunk(None, "eos"), USAGE, "[DONE]"), "finish_reason"),
        (GOOD_STREAM + _sse(_chunk("more")), "after [DONE]"),
    ],
)
def test_a_malformed_stream_is_lost(body: bytes, why: str) -> None:
    outcome = _one(_reply(body), "openai_chat_stream")
    assert outcome.status == "lost" and why in outcome.detail


def test_an_error_event_is_a_clear_error() -> None:
    error = {"error": {"message": "generation failed: boom", "type": "server_error", "code": None}}
    body = _sse(_chunk("Hi"), error, _chunk(None, "stop"), "[DONE]")
    outcome = _one(_reply(body), "openai_chat_stream")
    assert outcome.status == "clear_error" and "generation failed: boom" in outcome.detail


def test_a_completion_stream_counts_text_pieces() -> None:
    piece = {"choices": [{"index": 0, "text": " Paris", "finish_reason": None}]}
    last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    outcome = _one(_reply(_sse(piece, last, "[DONE]")), "openai_completion_stream")
    assert outcome.status == "answered" and outcome.ttft_s is not None


class _Pieces(httpx.SyncByteStream):
    """A streamed body that records how far it was read and whether the client closed it."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces, self.read, self.closed = pieces, 0, False

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.pieces:
            self.read += 1
            yield piece

    def close(self) -> None:
        self.closed = True


def test_disconnect_closes_after_the_first_piece() -> None:
    body = _Pieces(_sse(_chunk("Hel")), _sse(_chunk("lo")), _sse(_chunk(None, "stop"), "[DONE]"))
    outcome = _one(lambda request: httpx.Response(200, stream=body), "disconnect")
    assert (outcome.status, outcome.detail) == ("disconnected", "") and outcome.ttft_s is not None
    assert body.closed and body.read == 1


def test_disconnect_refused_before_any_content_is_a_clear_error() -> None:
    body = json.dumps({"error": {"message": "queue full", "code": "queue_full"}}).encode()
    assert _one(_reply(body, 429), "disconnect").status == "clear_error"


# ---- whole replies


def test_a_malformed_200_is_lost() -> None:
    assert _one(_reply(b'{"choices": [{"index": 0'), "openai_chat").status == "lost"
    no_finish = _chat_reply("Hi", finish=None)
    assert _one(_reply(json.dumps(no_finish).encode()), "openai_chat").status == "lost"


def test_a_500_with_a_json_error_is_clear_and_with_html_lost() -> None:
    error = {"error": {"message": "runner crashed", "type": "server_error", "code": "runner_crashed"}}
    clear = _one(_reply(json.dumps(error).encode(), 500), "openai_chat")
    assert clear.status == "clear_error" and "runner_crashed: runner crashed" in clear.detail
    html = _one(_reply(b"<html><body>Internal Server Error</body></html>", 500, "text/html"), "openai_chat")
    assert html.status == "lost" and "without a JSON error body" in html.detail


def test_an_ollama_route_wants_ollama_s_error_shape() -> None:
    assert _one(_reply(b'{"error": "model not found"}', 404), "ollama_chat").status == "clear_error"
    assert _one(_reply(b'{"error": {"message": "x"}}', 404), "ollama_chat").status == "lost"


def test_n2_wants_two_choices_indexed_0_and_1() -> None:
    assert _one(_reply(json.dumps(_chat_reply("a", "b")).encode()), "openai_n2").status == "answered"
    assert _one(_reply(json.dumps(_chat_reply("a")).encode()), "openai_n2").status == "lost"


def test_json_schema_replies_must_parse_unless_cut_by_length() -> None:
    good = _chat_reply('{"name":"Ann","age":30}')
    assert _one(_reply(json.dumps(good).encode()), "openai_json_schema").status == "answered"
    missing = _chat_reply('{"name":"Ann"}')
    assert _one(_reply(json.dumps(missing).encode()), "openai_json_schema").status == "lost"
    cut = _chat_reply('{"name":"An', finish="length")
    assert _one(_reply(json.dumps(cut).encode()), "openai_json_schema").status == "answered"


def test_tools_answered_with_a_call_or_text() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    reply["choices"][0]["finish_reason"] = "tool_calls"
    assert _one(_reply(json.dumps(reply).encode()), "openai_tools").status == "answered"
    assert _one(_reply(json.dumps(_chat_reply("Sunny")).encode()), "openai_tools").status == "answered"
    call["function"]["arguments"] = "{not json"
    assert _one(_reply(json.dumps(reply).encode()), "openai_tools").status == "lost"


def test_logprobs_entries_need_two_top_entries() -> None:
    entry = {"token": "Hi", "logprob": -0.1, "top_logprobs": [{"token": "Hi", "logprob": -0.1}] * 2}
    reply = _chat_reply("Hi")
    reply["choices"][0]["logprobs"] = {"content": [entry]}
    assert _one(_reply(json.dumps(reply).encode()), "openai_logprobs").status == "answered"
    entry["top_logprobs"] = entry["top_logprobs"][:1]
    assert _one(_reply(json.dumps(reply).encode()), "openai_logprobs").status == "lost"


def test_embeddings_need_vectors_of_one_length() -> None:
    good = {"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 1, "embedding": [0.3, 0.4]}]}
    assert _one(_reply(json.dumps(good).encode()), "openai_embeddings").status == "answered"
    assert _one(_reply(b'{"embeddings": [[0.1, 0.2], [0.3]]}'), "ollama_embed").status == "lost"
    refused = b'{"error": {"message": "this backend computes no embeddings"}}'
    assert _one(_reply(refused, 400), "openai_embeddings").status == "clear_error"


def test_without_embeddings_their_kinds_are_never_sent() -> None:
    traffic = Traffic("http://soak.test", "m", 64, embeddings=False, transport=httpx.MockTransport(_everything))
    assert {k.name for k in traffic.kinds} == set(KINDS) - {"openai_embeddings", "ollama_embed"}
    with pytest.raises(ValueError, match="unknown soak request kind"):
        Traffic("http://soak.test", "m", 64, kinds=("openai_chat", "chat"))


# ---- Ollama streams


def _ndjson(*lines: dict | str) -> bytes:
    return b"".join(((line if isinstance(line, str) else json.dumps(line)) + "\n").encode() for line in lines)


def _ollama_line(text: str, done: bool = False) -> dict:
    line: dict = {"model": "m", "message": {"role": "assistant", "content": text}, "done": done}
    return {**line, "done_reason": "stop", "eval_count": 2} if done else line


def test_an_ollama_stream_ending_in_done_is_answered() -> None:
    outcome = _one(
        _reply(_ndjson(_ollama_line("Hi"), _ollama_line(" there"), _ollama_line("", True))), "ollama_chat_stream"
    )
    assert outcome.status == "answered" and outcome.ttft_s is not None


def test_an_ollama_stream_ending_in_an_error_line_is_a_clear_error() -> None:
    outcome = _one(_reply(_ndjson(_ollama_line("Hi"), {"error": "generation failed: boom"})), "ollama_chat_stream")
    assert outcome.status == "clear_error" and "boom" in outcome.detail


def test_an_ollama_stream_without_done_is_lost() -> None:
    generate = _ndjson({"model": "m", "response": "Hi", "done": False})
    assert _one(_reply(generate), "ollama_generate_stream").status == "lost"
    assert _one(_reply(_ndjson(_ollama_line("Hi"), "{cut")), "ollama_chat_stream").status == "lost"


# ---- the canary


def test_a_canary_that_differs_later_is_lost() -> None:
    texts = iter([" 9, 10, 11,", " 9, 10, 11,", " 9, 10, 10, 11,"])  # the third repeats a token

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/v1/completions" and body["temperature"] == 0 and body["max_tokens"] == 12
        choice = {"index": 0, "text": next(texts), "finish_reason": "length"}
        return httpx.Response(200, json={"object": "text_completion", "choices": [choice]})

    traffic, rng = _traffic(handler, "canary"), random.Random(0)
    assert [traffic.run_one(rng).status for _ in range(2)] == ["answered", "answered"]
    third = traffic.run_one(rng)
    assert third.status == "lost" and third.detail.startswith("canary text differs: ' 9, 10, 10, 11,'")


# ---- refusals the server owes


def test_hostile_requests_want_their_refusal() -> None:
    too_large = json.dumps({"error": {"message": "request body is larger than 1048576 bytes"}}).encode()
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(request.content))
        return httpx.Response(413, content=too_large)

    assert _one(handler, "hostile_oversized").status == "clear_error" and sizes[0] > 1 << 20
    assert _one(_reply(json.dumps(_chat_reply("Hi")).encode()), "hostile_oversized").status == "lost"
    assert _one(_reply(too_large, 400), "hostile_oversized").status == "lost"  # the wrong status
    assert _one(_reply(b"Request Entity Too Large", 413, "text/plain"), "hostile_oversized").status == "lost"


@pytest.mark.parametrize("kind", ["hostile_malformed", "hostile_nested", "too_long"])
def test_a_400_refusal_is_clear_and_an_answer_lost(kind: str) -> None:
    error = json.dumps({"error": {"message": "no", "code": "too_deep"}}).encode()
    assert _one(_reply(error, 400), kind).status == "clear_error"
    assert _one(_reply(json.dumps(_chat_reply("Hi")).encode()), kind).status == "lost"


def test_near_context_is_answered_or_refused_for_its_length_only() -> None:
    overflow = {"error": {"message": "prompt 70 > 64", "code": "context_length_exceeded"}}
    assert _one(_reply(json.dumps(overflow).encode(), 400), "near_context").status == "clear_error"
    other = {"error": {"message": "bad field", "code": None}}
    assert _one(_reply(json.dumps(other).encode(), 400), "near_context").status == "lost"
    answer = {"choices": [{"index": 0, "text": " the", "finish_reason": "length"}]}
    assert _one(_reply(json.dumps(answer).encode()), "near_context").status == "answered"


def test_near_context_and_too_long_are_sized_from_n_ctx() -> None:
    words: dict[str, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        text = body.get("prompt") or body["messages"][-1]["content"]
        words[request.url.path] = len(text.split())
        return httpx.Response(400, json={"error": {"message": "too long", "code": "context_length_exceeded"}})

    _one(handler, "near_context", n_ctx=1024)
    _one(handler, "too_long", n_ctx=1024)
    assert words == {"/v1/completions": int((1024 - 64) / 1.3), "/v1/chat/completions": 2048}


# ---- broken connections and hangs


def test_a_reset_connection_is_lost_and_a_bug_never_escapes() -> None:
    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    lost = _one(reset, "ollama_chat")
    assert lost.status == "lost" and "RemoteProtocolError" in lost.detail

    def bug(request: httpx.Request) -> httpx.Response:
        raise KeyError("surprise")

    assert _one(bug, "openai_chat").detail == "KeyError: 'surprise'"


def test_a_stalled_stream_is_a_hang_within_the_deadline() -> None:
    def slow() -> Iterator[bytes]:
        yield _sse(_chunk("Hi"))
        time.sleep(0.4)
        yield _sse(_chunk(None, "stop"), USAGE, "[DONE]")

    outcome = _one(lambda request: httpx.Response(200, content=slow()), "openai_chat_stream", deadline_s=0.2)
    assert outcome.status == "hang" and outcome.latency_s < 1.0


def test_a_read_timeout_is_a_hang() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out")

    assert _one(timeout, "openai_completion").status == "hang"


def test_the_watchdog_bounds_a_body_that_stalls_on_a_real_socket() -> None:
    """The server sends its headers and one piece, then nothing: a read blocked on the socket would wait the read
    timeout again; the watchdog shuts the socket at the deadline instead."""
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        piece = _sse(_chunk("Hi"))
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        time.sleep(0.5)
        conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        done.wait(5)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    port = server.getsockname()[1]
    traffic = Traffic(f"http://127.0.0.1:{port}", "m", 64, deadline_s=0.7, kinds=("openai_chat_stream",))
    try:
        outcome = traffic.run_one(random.Random(0))
    finally:
        done.set()
        traffic.close()
        server.close()
    assert outcome.status == "hang" and "watchdog" in outcome.detail and outcome.ttft_s is not None
    assert outcome.latency_s < 1.1  # the read timeout alone would end it at about 0.5 + 0.7 s


# ---- drive


def _everything(request: httpx.Request) -> httpx.Response:
    """A mock server that answers every kind as hearth would, refusals included."""
    if len(request.content) > 1 << 20:
        return httpx.Response(413, json={"error": {"message": "request body is larger than 1048576 bytes"}})
    try:
        body = json.loads(request.content)
    except ValueError:
        return httpx.Response(400, json={"error": {"message": "the body is not valid JSON", "code": "invalid_json"}})
    if "x_nested" in body:
        return httpx.Response(400, json={"error": {"message": "too deep", "code": "too_deep"}})
    text = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", ()))
    if isinstance(text, str) and len(text.split()) > 64:
        return httpx.Response(400, json={"error": {"message": "too long", "code": "context_length_exceeded"}})
    path = request.url.path
    if path == "/v1/embeddings":
        return httpx.Response(200, json={"data": [{"index": i, "embedding": [0.6, 0.8]} for i in range(2)]})
    if path == "/api/embed":
        return httpx.Response(200, json={"embeddings": [[0.6, 0.8], [0.8, 0.6]]})
    if path.startswith("/api/"):
        if body.get("stream", True):
            key = "message" if path == "/api/chat" else "response"
            line = {key: {"role": "assistant", "content": "Hi"} if key == "message" else "Hi", "done": False}
            return httpx.Response(200, content=_ndjson(line, {**line, "done": True, "done_reason": "stop"}))
        return httpx.Response(200, json=_ollama_line("Hi", done=True))
    if body.get("logprobs"):
        return httpx.Response(400, json={"error": {"message": "no logprobs here", "param": "logprobs"}})
    if body.get("stream"):
        return httpx.Response(200, content=GOOD_STREAM)
    if path == "/v1/completions":
        return httpx.Response(200, json={"choices": [{"index": 0, "text": " Hi", "finish_reason": "stop"}]})
    return httpx.Response(200, json=_chat_reply(*['{"name":"Ann","age":3}'] * body.get("n", 1)))


def test_drive_accounts_for_every_request_of_every_client() -> None:
    started = time.monotonic()
    outcomes = drive(_traffic(_everything), clients=2, duration_s=1.0, seed=7)
    assert time.monotonic() - started < 3
    assert len(outcomes) > 20
    assert {o.status for o in outcomes} <= OK, [o for o in outcomes if o.status not in OK][:3]
    assert {o.kind for o in outcomes} == set(KINDS)  # the mock is fast: every kind comes up


def test_drive_stops_when_told() -> None:
    stop = threading.Event()
    stop.set()
    assert drive(_traffic(_everything), clients=3, duration_s=60, seed=1, stop=stop) == []


def test_drive_against_a_live_fake_backend() -> None:
    server = BackgroundServer(loaded_fake(), "fake-model")
    kinds = tuple(k for k in KINDS if k != "too_long")  # the fake backend checks no prompt against its context
    traffic = Traffic(server.url, "fake-model", 2048, deadline_s=30, kinds=kinds)
    try:
        outcomes = drive(traffic, clients=3, duration_s=3.0, seed=3)
    finally:
        traffic.close()
        server.stop()
    bad = [o for o in outcomes if o.status not in OK]
    assert outcomes and not bad, bad[:5]
    statuses = {(o.kind, o.status) for o in outcomes}
    assert ("canary", "clear_error") not in statuses and ("openai_chat_stream", "clear_error") not in statuses
    assert ("openai_logprobs", "answered") not in statuses  # the fake backend has no logits: a clear 400
