"""Model switching on a real `hearth serve` (issue 45 item 1): started with the starter, it answers a request
naming Gemma 3 270M (registered with `hearth models add`) by loading it in its own runner beside the starter, on
both engines, through the official `ollama` client and the openai client; /api/ps and /metrics list both; with
--max-loaded-models 1 the starter makes room and comes back on demand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.server.background import free_port
from tests.serve_process import wait_healthy

ollama = pytest.importorskip("ollama")

pytestmark = [pytest.mark.server, pytest.mark.slow]

STARTER = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m-q4_k_m"
HEARTH = str(Path(sys.executable).with_name("hearth"))
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


def _serve(home: Path, log: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HEARTH_HOME": str(home)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [HEARTH, "serve", "--port", str(port), "--ctx", "1024", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, 120, log)
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def home(tmp_path, starter_path, gemma_path) -> Path:  # type: ignore[no-untyped-def]
    h = tmp_path / "home"
    env = {**os.environ, "HEARTH_HOME": str(h)}
    subprocess.run([HEARTH, "models", "add", str(gemma_path)], env=env, check=True, capture_output=True)
    return h


@pytest.mark.parametrize("backend", ["llama.cpp", "torch"])
def test_a_request_for_another_local_model_loads_it_beside_the_first(home, tmp_path, backend: str) -> None:  # type: ignore[no-untyped-def]
    proc, url = _serve(home, tmp_path / "serve.log", "--backend", backend)
    try:
        client = ollama.Client(host=url, timeout=600)
        first = client.chat(model=STARTER, messages=ASK, options=GREEDY)
        assert "Paris" in first.message.content and first.load_duration == 0
        other = client.chat(model=GEMMA, messages=ASK, options=GREEDY)
        assert other.model == GEMMA and other.message.content and other.load_duration > 0
        assert other.done_reason in ("stop", "length")
        assert sorted(m.model for m in client.ps().models) == sorted([STARTER, GEMMA])
        again = client.chat(model=f"{STARTER}:latest", messages=ASK, options=GREEDY)
        assert again.message.content == first.message.content and again.load_duration == 0  # still loaded

        from openai import OpenAI

        oa = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        assert {m.id for m in oa.models.list().data} >= {STARTER, GEMMA}
        r = oa.chat.completions.create(model=GEMMA, messages=ASK, max_tokens=8, temperature=0)
        assert r.model == GEMMA and r.choices[0].message.content
        metrics = httpx.get(url + "/metrics", timeout=30).text
        assert "hearth_models_loaded 2.0" in metrics
        log = (tmp_path / "serve.log").read_text()
        assert f"loaded {GEMMA}:" in log  # the second model's plan and load, on stderr as the first's
    finally:
        _stop(proc)


def test_max_loaded_models_one_switches_back_and_forth(home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc, url = _serve(home, tmp_path / "serve.log", "--max-loaded-models", "1")
    try:
        client = ollama.Client(host=url, timeout=600)
        for model in (GEMMA, STARTER, GEMMA):
            r = client.generate(model=model, prompt="Say hi.", options=GREEDY)
            assert r.model == model and r.response
            assert [m.model for m in client.ps().models] == [model]
        with pytest.raises(ollama.ResponseError) as info:
            client.chat(model="no-such-model", messages=ASK)
        assert info.value.status_code == 404
    finally:
        _stop(proc)
