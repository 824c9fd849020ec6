"""One answering loop for both APIs (issue 44 item 3): Ollama's NDJSON and OpenAI's server-sent events are two
framings of app/server/answers.py's loops, so a failed generation, a constraint that hit its limits and a body
over the size limit read the same on both, each in its own shape; and Ollama's collected reply is its stream's
pieces put together (thinking, content and tool calls alike)."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest

from app.server.ollama_answers import OllamaLines
from backends.api import Capabilities, EventKind
from tests.fakes import FakeBackend, fake_spec, loaded_fake
from tests.tool_fixtures import CALL, WEATHER

pytestmark = pytest.mark.server

ASK = [{"role": "user", "content": "Capital?"}]
OLLAMA = {"model": "fake-model", "messages": ASK}
OPENAI = {"model": "fake-model", "messages": ASK}
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


class _LimitFake(FakeBackend):
    """A constrained backend whose failed replies stopped on llguidance's limits (error_code constraint_limit)."""

    capabilities = Capabilities(constraints=True, logits=False)

    def stream(self, request):  # type: ignore[no-untyped-def]
        for event in super().stream(request):
            if event.kind is EventKind.FINISHED and event.error:
                event = dataclasses.replace(event, error_code="constraint_limit")
            yield event


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


def test_a_failed_generation_is_one_error_in_each_apis_framing(live) -> None:
    backend = loaded_fake(replies=["Paris is the capital."])
    s = live(backend)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        backend.error_mid_stream = "the engine gave up"
        r = c.post("/api/chat", json={**OLLAMA, "stream": False})
        assert (r.status_code, r.json()) == (500, {"error": "generation failed: the engine gave up"})

        backend.error_mid_stream = "the engine gave up"
        lines = _lines(c.post("/api/chat", json=OLLAMA).text)
        assert lines[0]["message"]["content"] == "Paris" and lines[0]["done"] is False
        assert lines[-1] == {"error": "generation failed: the engine gave up"}  # no done line after the error
        assert not any(line.get("done") for line in lines)

        backend.error_mid_stream = "the engine gave up"
        r = c.post("/v1/chat/completions", json=OPENAI)
        assert r.status_code == 500 and r.json()["error"]["message"] == "generation failed: the engine gave up"

        backend.error_mid_stream = "the engine gave up"
        events = _events(c.post("/v1/chat/completions", json={**OPENAI, "stream": True}).text)
        error = json.loads(events[-3])["error"]
        assert error["message"] == "generation failed: the engine gave up" and error["type"] == "server_error"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_a_constraint_that_hit_its_limits_is_a_400_naming_each_apis_field(live) -> None:
    backend = _LimitFake(replies=['{"a": 1, "b": 2}'])
    backend.load()
    s = live(backend)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        backend.error_mid_stream = "too many states"
        r = c.post("/api/chat", json={**OLLAMA, "format": "json", "stream": False})
        assert (r.status_code, r.json()) == (400, {"error": "format: too many states"})

        backend.error_mid_stream = "too many states"
        lines = _lines(c.post("/api/chat", json={**OLLAMA, "format": "json"}).text)
        assert lines[-1] == {"error": "format: too many states"}

        backend.error_mid_stream = "too many states"
        r = c.post("/v1/chat/completions", json={**OPENAI, "response_format": {"type": "json_object"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
        assert r.json()["error"]["message"] == "response_format: too many states"


def test_one_size_limit_reads_both_apis_bodies(live) -> None:
    """A chunked body carries no Content-Length for the guard to check: the shared reader stops it at the limit."""
    s = live(loaded_fake(), limits={"max_body_bytes": 4096})
    body = json.dumps({**OPENAI, "pad": "x" * 5000}).encode()

    def chunked():  # a generator body: httpx sends it chunked
        yield from (body[i : i + 1000] for i in range(0, len(body), 1000))

    with httpx.Client(base_url=s.url, timeout=30) as c:
        for path in ("/api/chat", "/api/embed", "/api/show"):
            r = c.post(path, content=chunked(), headers={"content-type": "application/json"})
            assert (r.status_code, r.json()) == (413, {"error": "request body is larger than 4096 bytes"}), path
        r = c.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        assert r.json()["error"]["message"] == "request body is larger than 4096 bytes"
        # under the limit, Ollama's own validation still answers: a known field of the wrong type is a 400
        r = c.post("/api/chat", json={**OLLAMA, "keep_alive": [1]})
        assert r.status_code == 400 and "keep_alive" in r.json()["error"]


@pytest.mark.parametrize(
    "reply,think,tools",
    [
        ("  <think>Paris is in France.</think>\n\nParis.\n", True, False),
        ("<think>cut off before it clo", True, False),
        ("Checking.\n" + CALL + "\nDone.", False, True),
        ("<think>a call is due</think>\n" + CALL, True, True),
    ],
)
def test_ollamas_collected_reply_is_its_stream_put_together(live, reply: str, think: bool, tools: bool) -> None:
    backend = FakeBackend(spec=fake_spec(chat_template=THINKING_TEMPLATE), replies=[reply])
    backend.load()
    s = live(backend)
    body = {**OLLAMA, **({"think": True} if think else {}), **({"tools": [WEATHER]} if tools else {})}
    with httpx.Client(base_url=s.url, timeout=30) as c:
        whole = c.post("/api/chat", json={**body, "stream": False}).json()
        lines = _lines(c.post("/api/chat", json=body).text)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    message = whole["message"]
    assert "".join(line["message"]["content"] for line in lines) == message["content"]
    assert "".join(line["message"].get("thinking", "") for line in lines) == message.get("thinking", "")
    calls = [call for line in lines for call in line["message"].get("tool_calls", ())]
    assert [c["function"] for c in calls] == [c["function"] for c in message.get("tool_calls", ())]
    assert bool(calls) == tools and bool(message.get("thinking")) == think
    done = {k: v for k, v in lines[-1].items() if k not in ("message", "created_at") and not k.endswith("_duration")}
    assert done == {k: v for k, v in whole.items() if k in done}


def test_ollama_lines_write_no_opening_line_and_end_on_an_error() -> None:
    """The framing on its own: nothing when a choice starts, a text line a piece, one error line at a failure."""
    from app.server.errors import APIError

    lines = OllamaLines("m", chat=False, tools=None, think=False, param=None, where="req-1", arrived=0.0, load_s=0.0)
    assert lines.started(0, None) == []  # type: ignore[arg-type]
    assert lines.token(0, "") == [] and lines.token(0, "", final=True) == []
    (line,) = lines.token(0, "Hi")
    assert json.loads(line) == {
        "model": "m",
        "created_at": json.loads(line)["created_at"],
        "response": "Hi",
        "done": False,
    }
    assert lines.finished(0, None, APIError(500, "boom")) == [b'{"error": "boom"}\n']  # type: ignore[arg-type]
    assert lines.error(APIError(400, "bad")) == b'{"error": "bad"}\n'
    assert lines.ended([]) == [] and lines.closing() == []
