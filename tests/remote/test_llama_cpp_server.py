"""The remote backend against a server no one here wrote: llama-cpp-python's `python -m llama_cpp.server`
(PyPI `llama-cpp-python[server]`, the dev extra) serving the starter model on 127.0.0.1.

On Intel CPUs with AMX some llama.cpp builds crash in the AMX repack path (NOTES.md); hearth turns those buffers
off for its own llama.cpp runs, but llama_cpp.server has no setting for it, so this test skips there."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.cli import main
from app.requests import chat_request
from app.server.background import free_port
from backends.api import EventKind, FinishReason, SamplingParams
from backends.remote.backend import RemoteBackend
from backends.remote.spec import RemoteTarget, remote_spec
from hwprobe.errors import ConfigError

pytestmark = pytest.mark.slow

ALIAS = "smollm2-135m"


@pytest.fixture(scope="module")
def llama_server(starter_path: Path, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("sse_starlette", reason="llama-cpp-python[server] is not installed (the dev extra)")
    from backends.runner.memory import has_amx

    if has_amx():
        pytest.skip("llama.cpp's AMX repack path crashes some builds here (NOTES.md); llama_cpp.server can't opt out")
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(starter_path),
                "--model_alias",
                ALIAS,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "1024",
                "--n_threads",
                "2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"llama_cpp.server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(10)


def remote(url: str, model: str | None = None) -> RemoteBackend:
    backend = RemoteBackend(remote_spec(model or "", url), None, RemoteTarget(url, model))
    backend.load()
    return backend


def ask(backend: RemoteBackend, text: str, **sampling):
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": text}]
    return chat_request(backend.spec, messages, SamplingParams(temperature=0, **sampling)).request


def test_chat_streams_from_llama_cpp_server(llama_server):
    backend = remote(llama_server)
    assert backend.spec.name == ALIAS  # the first id /v1/models lists
    events = list(backend.stream(ask(backend, "What is the capital of France?", max_tokens=24)))
    assert events[0].kind is EventKind.STARTED and events[-1].kind is EventKind.FINISHED
    text = "".join(e.text for e in events if e.kind is EventKind.TOKEN)
    done = events[-1]
    assert done.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and text.strip()
    assert 0 < done.stats.completion_tokens <= 24 and done.stats.ttft_s > 0
    short = backend.generate(ask(backend, "Count from one to twenty.", max_tokens=3))
    assert short.finish_reason is FinishReason.LENGTH
    backend.close()


def test_abort_and_a_model_it_does_not_serve(llama_server):
    backend = remote(llama_server, ALIAS)
    request = ask(backend, "Write a long story about a dragon.", max_tokens=400)
    stream = backend.stream(request)
    assert next(stream).kind is EventKind.STARTED
    threading.Timer(0.3, backend.abort, (request.request_id,)).start()
    rest = list(stream)
    assert rest[-1].finish_reason is FinishReason.ABORT
    assert sum(1 for e in rest if e.kind is EventKind.TOKEN) < 400
    assert backend.generate(ask(backend, "Hi", max_tokens=4)).finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    backend.close()
    with pytest.raises(ConfigError, match=f"it serves {ALIAS}"):
        remote(llama_server, "gpt-5")


def test_hearth_run_through_llama_cpp_server(llama_server, capsys):
    assert main(["run", "--backend", "remote", "--url", llama_server + "/v1", "-t", "0", "-n", "16", "Hello"]) == 0
    assert capsys.readouterr().out.strip()
