"""A second real client that no one here wrote: Simon Willison's `llm` CLI (PyPI `llm`, pinned in the dev
extra), with an extra-openai-models.yaml entry pointing at `hearth serve` on 127.0.0.1 (as its documentation
tells users of OpenAI-compatible servers), with a tiny random-weight GGUF.

Chat, streamed (llm's default, with stream_options.include_usage) and not (--no-stream), must give the reply
the official openai client gets for the same greedy request; llm's completion model type with `-o logprobs 2`
stores the completions endpoint's top_logprobs in its log, read back with `llm logs --json`.  llm's user
directory is the test's own (LLM_USER_PATH), and nothing leaves 127.0.0.1.  One backend (the plan's choice):
each llm command costs ~4 s of start-up on 2 cores, and both backends' API is covered with the openai client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.server.background import free_port
from tests.gguf_factory import write_tiny_llama
from tests.serve_process import wait_healthy

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LLM = Path(sys.executable).with_name("llm")
MODEL = "tiny"
PROMPT = "Write one short sentence about the sea."


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not LLM.exists():
        pytest.skip("the llm CLI is not installed (pip install 'hearth-llm[dev]')")
    tmp = tmp_path_factory.mktemp("llm-cli")
    gguf = write_tiny_llama(tmp / "tiny.gguf")
    port = free_port()
    env = {**os.environ, "HEARTH_HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("HEARTH_API_KEY", None)
    log = tmp / "serve.log"
    with open(log, "wb") as out:
        # the backend the plan picks, as users run it (tests/server/test_server_sampling_surface.py covers both)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--model",
                str(gguf),
                "--port",
                str(port),
                "--ctx",
                "512",
                "--threads",
                "2",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/v1"
    wait_healthy(proc, f"http://127.0.0.1:{port}", 120, log)
    home = tmp / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f'- model_id: hearth-chat\n  model_name: {MODEL}\n  api_base: "{url}"\n'
        f'- model_id: hearth-completion\n  model_name: {MODEL}\n  api_base: "{url}"\n  completion: true\n'
    )
    llm_env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    llm_env["LLM_USER_PATH"] = str(home)
    yield url, llm_env
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def llm(env: dict, *args: str) -> str:
    done = subprocess.run([str(LLM), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_llm_chat_streamed_and_not_equals_the_openai_client(served) -> None:
    from openai import OpenAI

    url, env = served
    want = (
        OpenAI(base_url=url, api_key="unused", max_retries=0)
        .chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            temperature=0,
            max_tokens=12,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .message.content
    )
    assert want
    options = ["-o", "temperature", "0", "-o", "max_tokens", "12"]
    # ignore_eos is not an llm option: the tiny model may stop early, so compare prefixes of equal length
    streamed = llm(env, "-m", "hearth-chat", PROMPT, *options).removesuffix("\n")
    plain = llm(env, "-m", "hearth-chat", PROMPT, *options, "--no-stream").removesuffix("\n")
    assert streamed == plain
    assert want.startswith(streamed) and streamed
    logged = json.loads(llm(env, "logs", "-n", "2", "--json"))
    assert [entry["response"] for entry in logged] == [streamed, plain]
    assert logged[0]["response_json"]["usage"]["completion_tokens"] >= 1  # include_usage reached llm


def test_llm_completion_model_gets_top_logprobs(served) -> None:
    url, env = served
    text = llm(
        env,
        "-m",
        "hearth-completion",
        "The capital of France is",
        "-o",
        "logprobs",
        "2",
        "-o",
        "max_tokens",
        "4",
        "-o",
        "temperature",
        "0",
    ).removesuffix("\n")
    entry = json.loads(llm(env, "logs", "-n", "1", "--json"))[0]
    assert entry["response"] == text
    logprobs = entry["response_json"]["logprobs"]
    assert len(logprobs) >= 1 and "".join(part["text"] for part in logprobs) == text
    for part in logprobs:
        (top,) = part["top_logprobs"]
        assert 2 <= len(top) <= 3 and part["text"] in top and all(v <= 0 for v in top.values())
