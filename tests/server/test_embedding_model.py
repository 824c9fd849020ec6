"""An embedding model (a tiny BERT GGUF) end to end: `hearth models` and `hearth show` call it one, `hearth run`
refuses to chat with it, and `hearth serve` serves its embeddings on both APIs while refusing chat on both, each
in its own error shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.server.background import free_port
from tests.bert_gguf_factory import write_tiny_bert
from tests.serve_process import wait_healthy

pytestmark = [pytest.mark.server, pytest.mark.slow]

HEARTH = str(Path(sys.executable).with_name("hearth"))


def test_an_embedding_model_is_listed_served_for_embeddings_and_refused_for_chat(tmp_path) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home")}
    path = write_tiny_bert(tmp_path / "tiny-bert.gguf")

    def hearth(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([HEARTH, *args], env=env, capture_output=True, text=True, timeout=120)

    assert hearth("models", "add", str(path), "--name", "tinybert").returncode == 0
    (row,) = [r for r in json.loads(hearth("models", "--json").stdout) if r["name"] == "tinybert"]
    assert row["kind"] == "embedding" and row["pooling"] == "mean" and row["backends"] == ["llama.cpp"]
    assert "embedding (mean pooling; not for chat)" in hearth("show", "tinybert").stdout
    run = hearth("run", "--model", "tinybert", "hello")
    assert run.returncode == 2 and "is an embedding model" in run.stderr and "Traceback" not in run.stderr

    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [HEARTH, "serve", "--model", "tinybert", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 60, log)
        assert "embedding model (bert): planned for one sequence" in log.read_text()
        r = httpx.post(url + "/v1/embeddings", json={"model": "tinybert", "input": ["the cat", "paris"]}, timeout=30)
        vectors = np.array([d["embedding"] for d in r.json()["data"]])
        assert vectors.shape == (2, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
        r = httpx.post(url + "/api/embed", json={"model": "tinybert", "input": "the cat"}, timeout=30).json()
        assert np.allclose(r["embeddings"][0], vectors[0], atol=1e-5)
        assert r["prompt_eval_count"] == 4  # [CLS] the cat [SEP]
        show = httpx.post(url + "/api/show", json={"model": "tinybert"}, timeout=30).json()
        assert show["capabilities"] == ["embedding"]

        ask = [{"role": "user", "content": "hello"}]
        r = httpx.post(url + "/v1/chat/completions", json={"model": "tinybert", "messages": ask}, timeout=30)
        assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]
        r = httpx.post(url + "/api/chat", json={"model": "tinybert", "messages": ask}, timeout=30)
        assert r.status_code == 400 and "embedding model" in r.json()["error"]
        r = httpx.post(url + "/api/generate", json={"model": "tinybert", "prompt": "hello"}, timeout=30)
        assert r.status_code == 400 and set(r.json()) == {"error"}
        r = httpx.post(url + "/v1/embeddings", json={"model": "tinybert", "input": "cat " * 200}, timeout=30)
        assert r.status_code == 400 and "context of 128" in r.json()["error"]["message"]  # its training context
    finally:
        proc.terminate()
        proc.wait(30)
