"""The HTTP layer against a scripted FakeBackend: errors, auth, limits, disconnects, metrics."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.fakes import loaded_fake as fake

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


def ok_body(**kw) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **kw}


BAD = [
    ("malformed json", b"{not json", 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("missing messages", {"model": "fake-model"}, 400, "messages"),
    ("empty messages", ok_body(messages=[]), 400, "messages"),
    ("unknown role", ok_body(messages=[{"role": "wizard", "content": "x"}]), 400, "messages.0.role"),
    ("content not a string", ok_body(messages=[{"role": "user", "content": 5}]), 400, "messages.0.content"),
    ("temperature a string", ok_body(temperature="hot"), 400, "temperature"),
    ("unknown model", {**ok_body(), "model": "nope"}, 404, "model"),
    ("max_tokens zero", ok_body(max_tokens=0), 400, "max_tokens"),
    ("max_tokens above context", ok_body(max_tokens=10_000), 400, "max_tokens"),
    ("n of 17", ok_body(n=17), 400, "n"),
    ("n of 0", ok_body(n=0), 400, "n"),
    ("a field hearth does not serve", ok_body(best_of=2), 400, "best_of"),
    ("an unknown field", ok_body(temprature=0.5), 400, "temprature"),
    ("prompt longer than context", ok_body(messages=[{"role": "user", "content": "x"}]), 400, None),
]


def test_bad_input_gets_openai_error_and_server_keeps_serving(live) -> None:
    from backends.errors import ContextOverflowError

    backend = fake()
    s = live(backend)
    with httpx.Client(base_url=s.url) as c:
        for name, body, status, param in BAD:
            if name == "prompt longer than context":
                backend.fail_next = ContextOverflowError("prompt is 5000 tokens, the context holds 2048")
            r = c.post(CHAT, content=body) if isinstance(body, bytes) else c.post(CHAT, json=body)
            assert r.status_code == status, (name, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], name
            if param:
                assert err["param"] == param, (name, err)
        assert c.post(CHAT, json=ok_body()).status_code == 200
        assert c.post(CHAT, content=b"x" * ((1 << 20) + 1)).status_code == 413
        metrics = c.get("/metrics").text
    assert 'hearth_http_requests_total{path="/v1/chat/completions",status="400"} 14.0' in metrics
    assert 'hearth_http_requests_total{path="/v1/chat/completions",status="200"} 1.0' in metrics


def test_api_key(live) -> None:
    s = live(fake(), api_key="sekrit")
    with httpx.Client(base_url=s.url) as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = c.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-model"
        assert c.get("/health").status_code == 200  # documented: liveness stays open


def test_queue_limit_gives_429_with_retry_after(live) -> None:
    backend = fake(replies=["one two three"])
    backend.hold = threading.Event()
    s = live(backend, limits={"max_concurrency": 4, "queue_limit": 2})  # fake serialises: 1 running + 2 queued
    results: list[int] = []

    def call() -> None:
        results.append(httpx.post(s.url + CHAT, json=ok_body(), timeout=30).status_code)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    r = httpx.post(s.url + CHAT, json=ok_body(), timeout=10)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    metrics = httpx.get(s.url + "/metrics").text
    assert "hearth_queue_depth 2.0" in metrics and "hearth_requests_running 1.0" in metrics
    backend.hold.set()
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]


def test_disconnect_mid_stream_aborts(live) -> None:
    backend = fake(replies=[" ".join(["word"] * 200)], token_delay_s=0.02)
    aborted: list[str] = []
    real_abort = backend.abort
    backend.abort = lambda rid: (aborted.append(rid), real_abort(rid))  # type: ignore[method-assign]
    s = live(backend)
    with httpx.Client(base_url=s.url) as c:
        with c.stream("POST", CHAT, json=ok_body(stream=True)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for line in lines:
                if '"content": "word"' in line:
                    break
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            metrics = c.get("/metrics").text
            if "hearth_requests_running 0.0" in metrics and 'reason="abort"' in metrics:
                break
            time.sleep(0.05)
    assert "hearth_requests_running 0.0" in metrics
    assert 'hearth_requests_finished_total{reason="abort"} 1.0' in metrics
    assert aborted == [backend.requests[0].request_id]
    assert not s.app.state.runner.active


def test_completion_prompt_as_token_ids_and_ignore_eos(live) -> None:
    """OpenAI's /v1/completions also takes the prompt as token ids; `ignore_eos` is vLLM's extension."""
    backend = fake(replies=["one two"])
    s = live(backend)
    with httpx.Client(base_url=s.url) as c:
        r = c.post(
            "/v1/completions", json={"model": "fake-model", "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}
        )
        assert r.status_code == 200, r.text
        req = backend.requests[-1]
        assert req.prompt_token_ids == (5, 6, 7) and req.prompt is None and req.sampling.ignore_eos
        assert c.post("/v1/completions", json={"model": "fake-model", "prompt": "hi"}).status_code == 200
        assert not backend.requests[-1].sampling.ignore_eos
        for bad, param in (([], "prompt"), ([1, "x"], "prompt"), ([1, 10**9], "prompt"), ([-1], "prompt")):
            r = c.post("/v1/completions", json={"model": "fake-model", "prompt": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (bad, r.text)
