"""`hearth serve` plans for serving (issue 17 item 4): by default the torch engine batches concurrent clients,
on this CPU too, and the start-up lines say so and why; --single-user plans the single-stream engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.server.background import free_port
from tests.serve_process import wait_healthy

ROOT = Path(__file__).resolve().parents[2]


def _hearth(*args: str) -> list[str]:
    return [sys.executable, "-m", "app", *args]


def test_single_user_and_more_concurrency_is_a_config_error(tmp_path: Path) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path)}
    p = subprocess.run(
        _hearth("serve", "--single-user", "--max-concurrency", "4"),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "--single-user runs one request at a time, but --max-concurrency is 4" in p.stderr
    p = subprocess.run(
        _hearth("serve", "--max-loaded-models", "0"), env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2 and "--max-loaded-models must be at least 1, got 0" in p.stderr, p.stderr


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize(
    "flags,engine,why",
    [
        ((), "(torch, up to 16 requests batched;", "  why: serving: up to 16 requests at once, batched by the torch"),
        (
            ("--single-user",),
            "(llama.cpp, one request at a time (others queue);",
            "  why: single user (max concurrency 1)",
        ),
    ],
)
def test_start_up_lines_say_which_engine_serves_and_why(
    starter_path: Path, tmp_path: Path, flags: tuple, engine: str, why: str
) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path)}
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            _hearth("serve", "--model", str(starter_path), "--port", str(port), "--ctx", "1024", *flags),
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 120, log)
        text = log.read_text()
        serving = next(line for line in text.splitlines() if line.startswith("serving "))
        assert engine in serving, text
        assert any(line.startswith(why) for line in text.splitlines()), text
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={
                "model": model,
                "max_tokens": 8,
                "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            },
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
