"""`hearth serve` as a subprocess with the starter model (llama.cpp), driven by the official openai client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.server.background import free_port
from tests.serve_process import wait_healthy

pytestmark = [pytest.mark.server, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
HEARTH = str(Path(sys.executable).with_name("hearth"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    env = {**os.environ, "HEARTH_HOME": str(tmp_path_factory.mktemp("home")), "HEARTH_API_KEY": "k3y"}
    log = tmp_path_factory.mktemp("log") / "serve.log"
    with open(log, "wb") as out:
        # llama.cpp as asked: the default serve plans the torch engine on this CPU (tests/server/test_serve_plan.py)
        proc = subprocess.Popen(
            [HEARTH, "serve", "--port", str(port), "--ctx", "1024", "--backend", "llama.cpp"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, 60, log)
    yield proc, url, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def client(url: str, key: str = "k3y"):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_chat_non_streaming_and_streaming_agree(server) -> None:
    _, url, log = server
    assert "plan:" in log.read_text() and "loaded:" in log.read_text()  # the plan is stated at start-up
    c = client(url)
    assert [m.id for m in c.models.list().data] == [MODEL]
    r = c.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30, seed=1)
    text = r.choices[0].message.content
    assert "Paris" in text and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 3
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            temperature=0,
            max_tokens=30,
            seed=1,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"


def test_completion_length_and_stop(server) -> None:
    _, url, _ = server
    c = client(url)
    r = c.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model=MODEL, prompt="One, two, three, four,", max_tokens=5, temperature=0, stream=True
        )
    )
    assert streamed == r.choices[0].text
    r = c.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=20, temperature=0, stop=[","])
    assert "," not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_errors_through_the_openai_client(server) -> None:
    import openai

    _, url, _ = server
    with pytest.raises(openai.AuthenticationError):
        client(url, key="wrong").models.list()
    c = client(url)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 2000}], max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4096)
    metrics = httpx.get(url + "/metrics", headers={"Authorization": "Bearer k3y"}).text
    assert 'hearth_http_requests_total{path="/v1/models",status="401"} 1.0' in metrics
    assert "hearth_generation_tokens_total" in metrics and "hearth_requests_running 0.0" in metrics


def test_sigterm_finishes_and_exits_0(server) -> None:
    proc, url, _ = server
    import threading

    result = {}

    def long_call() -> None:
        r = client(url).completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=200, temperature=0, extra_body={"ignore_eos": True}
        )
        result["reason"] = r.choices[0].finish_reason

    t = threading.Thread(target=long_call)
    t.start()
    deadline = time.monotonic() + 30  # SIGTERM once the request runs (a fixed sleep lost the race under load)
    auth = {"Authorization": "Bearer k3y"}
    while "hearth_requests_running 1.0" not in httpx.get(url + "/metrics", headers=auth).text:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert proc.wait(30) == 0
    assert result.get("reason") == "length"  # the running request finished within the grace period
