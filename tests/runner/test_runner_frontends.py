"""A runner that dies or freezes under `hearth serve` and `hearth run`, as a person or a client sees it.

The CLI runs for real (a subprocess, its runner a grandchild); HEARTH_BACKEND_CLASS makes the runner load the
misbehaving fakes of tests/runner_fakes.py for the starter model's spec."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_process import wait_healthy

pytestmark = pytest.mark.server
ROOT = str(Path(__file__).resolve().parents[2])
MODEL = "smollm2-135m-instruct.q4_1"  # the name `hearth serve --model PATH` serves the starter file under


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "HEARTH_BACKEND_CLASS": "tests.runner_fakes:CrashingFake",
        "PYTHONPATH": ROOT,
        "HEARTH_FAKE_TOKEN_DELAY": "0.05",
        **extra,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve(starter_path: Path):
    procs: list[subprocess.Popen] = []

    def start(**env: str) -> str:
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--model", str(starter_path), "--port", str(port)],
            env=_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(
            proc,
            url,
            60,
            lambda: (
                (proc.stderr.read() if proc.stderr else "") if proc.poll() is not None else "hearth serve did not start"
            ),
            interval_s=0.1,
        )
        return url + "/v1"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(20)


def _victim_and_bystander(client: openai.OpenAI, trigger: str) -> tuple[Exception | None, str]:
    """The victim streams and kills the runner; a bystander sent meanwhile (queued behind it) must succeed."""
    out: dict[str, object] = {}

    def bystander() -> None:
        time.sleep(0.05)
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "innocent"}])
        out["text"] = r.choices[0].message.content

    t = threading.Thread(target=bystander)
    t.start()
    error: Exception | None = None
    try:
        for _ in client.chat.completions.create(
            model=MODEL, stream=True, messages=[{"role": "user", "content": trigger}]
        ):
            pass
    except openai.APIError as exc:
        error = exc
    t.join(60)
    return error, str(out.get("text"))


@pytest.mark.parametrize(
    "trigger,env,said",
    [("please CRASH", {}, "SIGSEGV"), ("please HANG", {"HEARTH_RUNNER_TIMEOUT": "2"}, "stopped answering")],
)
def test_serve_survives_a_runner_that_dies_or_freezes(serve, trigger, env, said) -> None:
    url = serve(**env)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    error, bystander = _victim_and_bystander(client, trigger)
    assert error is not None and said in str(error), error  # the victim is told what happened
    assert bystander.startswith("one two three")  # the concurrent request ran on the new runner
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "next"}])
    assert r.choices[0].message.content.startswith("one two three")  # and the next one too
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200


def test_run_prints_one_line_and_exits_non_zero_when_the_runner_dies(starter_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "app", "run", "--model", str(starter_path), "please CRASH"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr and "core dumped" not in p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("hearth: error: ")]
    assert len(errors) == 1 and "SIGSEGV" in errors[0], p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "app", "run", "--model", str(starter_path), "CRASH-NOW"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("hearth: error: ") and "SIGSEGV" in p.stderr.splitlines()[0], p.stderr
