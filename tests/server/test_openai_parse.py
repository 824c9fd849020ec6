"""The official openai client's structured outputs against `hearth serve` on both backends (starter model):
`client.chat.completions.parse(response_format=PydanticModel)` (not beta in the pinned openai 3.60), a
json_object reply, a streamed json_schema reply, and finish_reason "length" on a cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from app.server.background import free_port
from tests.serve_process import wait_healthy

pytestmark = [pytest.mark.server, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
HEARTH = str(Path(sys.executable).with_name("hearth"))
ASK = [{"role": "user", "content": "Describe the city of Paris: its name, its country and two landmarks."}]


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    landmarks: list[str] = Field(max_length=2)


@pytest.fixture(scope="module", params=["llama.cpp", "torch"])
def url(request, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "HEARTH_HOME": str(tmp_path_factory.mktemp("home")), "HEARTH_THREADS": "2"}
    log = tmp_path_factory.mktemp("log") / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [HEARTH, "serve", "--port", str(port), "--ctx", "1024", "--backend", request.param],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, 180, log, interval_s=0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_parse_with_a_pydantic_model(url: str) -> None:
    r = client(url).chat.completions.parse(
        model=MODEL, messages=ASK, response_format=City, temperature=0, max_tokens=120
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    city = choice.message.parsed
    assert isinstance(city, City) and city.name and len(city.landmarks) <= 2


def test_json_object_streamed_and_cut(url: str) -> None:
    c = client(url)
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=ASK,
            temperature=0,
            max_tokens=120,
            stream=True,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": City.model_json_schema()},
            },
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    City.model_validate_json(text)
    r = c.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=4, response_format={"type": "json_object"}
    )
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")
    r = c.completions.create(
        model=MODEL,
        prompt="A JSON object describing a dog:",
        temperature=0,
        max_tokens=80,
        extra_body={"response_format": {"type": "json_object"}},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text), dict)
    else:
        assert r.choices[0].finish_reason == "length" and r.choices[0].text.startswith("{")
