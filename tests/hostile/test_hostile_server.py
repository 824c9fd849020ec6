"""The server's cost per request is bounded by its size (issue 16, item 5), and a template never freezes it
(item 4): every case is a live server on 127.0.0.1; the bodies and the GGUF are generated here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.server.background import BackgroundServer, free_port
from tests.fakes import FakeBackend, fake_spec
from tests.fakes import loaded_fake as fake

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
ROOT = Path(__file__).resolve().parents[2]
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture
def live():
    """start(backend, **config): a live server for `backend` (model "fake-model"), stopped after the test."""
    servers: list[BackgroundServer] = []

    def start(backend: FakeBackend, **config) -> BackgroundServer:
        servers.append(BackgroundServer(backend, "fake-model", **config))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def chat_body(**kw) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **kw}


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


# -- size ------------------------------------------------------------------------------------------------
def test_thirty_thousand_empty_messages_get_a_quick_400_naming_the_cap(live) -> None:
    backend = fake()
    s = live(backend)
    body = json.dumps(chat_body(messages=[{"role": "user", "content": ""}] * 30_000)).encode()
    assert 850_000 < len(body) < 1 << 20  # the 0.9 MB body of the issue, under the 1 MiB body limit
    start = time.monotonic()
    r = httpx.post(s.url + CHAT, content=body, timeout=30)
    assert time.monotonic() - start < 5.0
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "too_many_messages" and err["param"] == "messages"
    assert "30000 messages" in err["message"] and "at most 4096" in err["message"]
    assert backend.requests == []  # nothing reached the model
    at_cap = chat_body(messages=[{"role": "user", "content": "x"}] * 4096, max_tokens=1)
    assert httpx.post(s.url + CHAT, json=at_cap, timeout=30).status_code == 200


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [65, 1_000, 200_000])
def test_deeply_nested_json_is_a_400(live, depth: int) -> None:
    s = live(fake())
    body = json.dumps(chat_body())[:-1] + f', "extra": {nested(depth)}}}'
    r = httpx.post(s.url + CHAT, content=body.encode(), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "too_deep" and "64 levels" in err["message"]
    # 60 levels pass the depth check; the unknown field holding them is then refused by name (never ignored)
    ok = json.dumps(chat_body())[:-1] + f', "extra": {nested(60)}}}'
    r = httpx.post(s.url + CHAT, content=ok.encode(), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "extra", r.text


SURROGATES = [
    ("content", lambda: chat_body(messages=[{"role": "user", "content": "a\ud800b"}]), CHAT, "messages.0.content"),
    ("stop", lambda: chat_body(stop=["\udfff"]), CHAT, "stop.0"),
    ("model", lambda: {**chat_body(), "model": "\ud800"}, CHAT, "model"),
    ("key", lambda: {**chat_body(), "\ud800": 1}, CHAT, ""),
    ("prompt", lambda: {"model": "fake-model", "prompt": "\udc00"}, "/v1/completions", "prompt"),
]


@pytest.mark.parametrize("name, make, path, where", SURROGATES, ids=[c[0] for c in SURROGATES])
def test_lone_surrogates_are_a_400(live, name, make, path, where) -> None:
    s = live(fake())
    body = json.dumps(make()).encode()  # ensure_ascii writes the lone surrogate as a \\udXXX escape
    assert b"\\ud" in body
    r = httpx.post(s.url + path, content=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_unicode" and "lone UTF-16 surrogate" in err["message"], err
    assert err["param"] == (where or None)


def test_valid_surrogate_pairs_and_escaped_backslashes_pass(live) -> None:
    backend = fake()
    s = live(backend)
    for content in ("emoji 😀", "a literal \\ud800 in text"):  # the emoji goes as a \ud83d\ude00 pair
        r = httpx.post(
            s.url + CHAT, content=json.dumps(chat_body(messages=[{"role": "user", "content": content}])), timeout=30
        )
        assert r.status_code == 200, r.text
        assert content in backend.requests[-1].prompt


# -- disconnects -----------------------------------------------------------------------------------------
def recording_aborts(backend: FakeBackend) -> list[tuple[str, float]]:
    aborted: list[tuple[str, float]] = []
    real_abort = backend.abort
    backend.abort = lambda rid: (aborted.append((rid, time.monotonic())), real_abort(rid))  # type: ignore
    return aborted


def test_non_streaming_client_that_disconnects_aborts_its_request(live) -> None:
    backend = fake(replies=[" ".join(["word"] * 400)], token_delay_s=0.02)  # 8 s to the end
    aborted = recording_aborts(backend)
    s = live(backend)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(s.url + CHAT, json=chat_body(), timeout=httpx.Timeout(30, read=0.6))
    gone = time.monotonic()
    assert wait_for(lambda: bool(aborted)), "the backend request was never aborted"
    assert aborted[0][0] == backend.requests[0].request_id
    assert aborted[0][1] - gone < 1.5, aborted[0][1] - gone
    assert wait_for(lambda: not s.app.state.runner.active and s.app.state.runner.running == 0)
    metrics = httpx.get(s.url + "/metrics").text
    assert 'hearth_requests_finished_total{reason="abort"} 1.0' in metrics


def test_non_streaming_client_that_leaves_while_queued_never_runs(live) -> None:
    backend = fake(replies=["one two"])
    backend.hold = threading.Event()
    s = live(backend)
    first = threading.Thread(target=lambda: httpx.post(s.url + CHAT, json=chat_body(), timeout=30))
    first.start()
    assert wait_for(lambda: len(backend.requests) == 1)
    with pytest.raises(httpx.ReadTimeout):  # waits behind the first (the fake runs one at a time)
        httpx.post(s.url + CHAT, json=chat_body(), timeout=httpx.Timeout(30, read=0.5))
    assert wait_for(lambda: s.app.state.runner.waiting == 0)
    backend.hold.set()
    first.join(30)
    time.sleep(0.2)
    assert len(backend.requests) == 1  # the one that left never reached the model


# -- auth ------------------------------------------------------------------------------------------------
def test_utf8_api_key_works(live) -> None:
    key = "clé-ключ-🔑"
    s = live(fake(), api_key=key)
    with httpx.Client(base_url=s.url) as c:
        ok = c.get("/v1/models", headers={"Authorization": f"Bearer {key}".encode()})
        assert ok.status_code == 200, ok.text
        assert c.get("/v1/models", headers={"Authorization": "Bearer cl\xe9".encode("latin-1")}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": b"Bearer \xff\xfe"}).status_code == 401
        assert c.get("/v1/models").status_code == 401
        r = c.post(CHAT, json=chat_body(), headers={"Authorization": f"Bearer {key}".encode()})
        assert r.status_code == 200, r.text


# -- templates under the server ----------------------------------------------------------------------------
def test_hostile_template_is_a_400_and_never_freezes_the_server(live) -> None:
    backend = fake(spec=fake_spec(chat_template=LOOP))
    s = live(backend)
    result: dict = {}

    def post() -> None:
        start = time.monotonic()
        result["response"] = httpx.post(s.url + CHAT, json=chat_body(), timeout=30)
        result["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=post)
    thread.start()
    time.sleep(0.3)  # the template is rendering now
    with httpx.Client(base_url=s.url) as c:
        for _ in range(5):
            start = time.monotonic()
            assert c.get("/health").status_code == 200
            assert time.monotonic() - start < 0.5
            time.sleep(0.1)
    thread.join(30)
    r = result["response"]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "template_error" and "time budget" in err["message"] and "\n" not in err["message"]
    assert result["elapsed"] < 6
    assert backend.requests == []


def test_template_syntax_error_is_a_one_line_400(live) -> None:
    s = live(fake(spec=fake_spec(chat_template="{% if %}")))
    r = httpx.post(s.url + CHAT, json=chat_body(), timeout=30)
    assert r.status_code == 400
    assert "does not parse (line 1" in r.json()["error"]["message"]


def test_sigterm_stops_hearth_serve_during_a_hostile_render(tmp_path: Path) -> None:
    from tests.gguf_factory import write_tiny_llama

    model = write_tiny_llama(tmp_path / "loop.gguf", chat_template=LOOP)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--model",
            str(model),
            "--backend",
            "llama.cpp",
            "--port",
            str(port),
            "--shutdown-grace",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(healthy, 60), "hearth serve did not start"
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        thread = threading.Thread(target=lambda: httpx.post(url + CHAT, json=body, timeout=30), daemon=True)
        thread.start()
        time.sleep(0.5)  # the template is rendering now
        start = time.monotonic()
        assert httpx.get(url + "/health", timeout=2).status_code == 200
        assert time.monotonic() - start < 0.5
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
        assert rc == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- tokenization in linear time (llama.cpp) -----------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(starter_path: Path):
    from backends.api import LoadOptions
    from backends.llama_cpp.backend import LlamaCppBackend
    from backends.modelspec import load_spec

    backend = LlamaCppBackend(load_spec(starter_path), LoadOptions(n_ctx=256, n_threads=1))
    backend.load()
    yield backend
    backend.close()


def test_llama_cpp_tokenizes_thirty_thousand_messages_in_linear_time(llama, monkeypatch) -> None:
    """llama.cpp's own special-token split is quadratic (65 s for this text); hearth's chunks keep each call
    at CHUNK_SPECIALS special tokens, so the total is linear."""
    from backends.llama_cpp import tokens
    from backends.templates import render_for_spec

    text = render_for_spec(llama.spec, [{"role": "user", "content": ""}] * 30_000).text
    calls: list[bytes] = []
    real = tokens._llama_tokenize
    monkeypatch.setattr(tokens, "_llama_tokenize", lambda v, data, p: (calls.append(data), real(v, data, p))[1])
    start = time.monotonic()
    ids = llama.tokenize(text, add_special=True, parse_special=True)
    elapsed = time.monotonic() - start
    # <|im_start|> (1) opens the default system turn, 30,000 user turns and the reply; <|im_end|> (2) closes 30,001
    assert ids.count(1) == 30_002 and ids.count(2) == 30_001
    assert max(c.count(b"<|im_") for c in calls) <= tokens.CHUNK_SPECIALS
    assert elapsed < 20, elapsed  # ~1-2 s on a loaded 2-core EPYC
    flood = "<|im_end|>" * 100_000  # a 1 MB prompt of special tokens (/v1/completions takes one)
    start = time.monotonic()
    assert llama.tokenize(flood, add_special=False) == [2] * 100_000
    assert time.monotonic() - start < 20


def test_chunked_tokenization_gives_llama_cpps_own_ids(llama, monkeypatch) -> None:
    import random

    from backends.llama_cpp import tokens

    monkeypatch.setattr(tokens, "CHUNK_SPECIALS", 3)  # cut often, so every kind of boundary is crossed
    pieces = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<repo_name>",
        "<reponame>",
        " ",
        "\n",
        "  ",
        "\t",
        "hello",
        " world",
        "é",
        "日本",
        "<|im",
        "_start|>",
        "<",
        "|>",
        "12345",
        "'s",
    ]
    rng = random.Random(16)
    llm = llama._llm
    for _ in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 120)))
        for add_special in (True, False):
            for parse_special in (True, False):
                expected = list(llm.tokenize(text.encode(), add_bos=add_special, special=parse_special))
                assert llama.tokenize(text, add_special, parse_special) == expected, (text, add_special)
