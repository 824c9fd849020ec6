"""Tool calling on the real starter model (SmolLM2, a ChatML template without tool support: hearth's
Hermes-style block) through `hearth serve`, on both backends, with the official openai client.

- tool_choice "required" and a named function: constrained decoding makes the reply one call whose arguments
  validate against the function's schema;
- streaming: the tool-call deltas reassemble to the call the same request returns whole (greedy, seeded);
- a tool result goes back (its call and result rendered into the prompt), and under "auto" the model answers
  or calls again: whatever it does comes back well formed (a 135M model's choice is not asserted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.server.background import free_port
from tests.serve_process import wait_healthy

pytestmark = [pytest.mark.server, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[2]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
GREEDY = {"temperature": 0, "seed": 1, "max_tokens": 40}


@pytest.fixture(scope="module", params=["llama.cpp", "torch"])
def client(request, starter_path, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "HEARTH_HOME": str(tmp_path_factory.mktemp("home")), "PYTHONPATH": str(ROOT)}
    log = tmp_path_factory.mktemp("log") / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port), "--ctx", "1024", "--backend", request.param],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 120, log)
        from openai import OpenAI

        yield OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    finally:
        proc.kill()
        proc.wait()


def valid_call(call, tool: dict) -> dict:
    jsonschema = pytest.importorskip("jsonschema")
    assert call.type == "function" and call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


FORCED = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", **GREEDY)


@pytest.fixture(scope="module")
def forced(client):
    """The reply to FORCED, asked once per backend (the machine is shared: every request counts)."""
    return client.chat.completions.create(**FORCED)


def test_required_and_named_choices_return_a_valid_call(client, forced) -> None:
    forced = forced.choices[0]
    assert forced.finish_reason == "tool_calls", forced
    (call,) = forced.message.tool_calls
    valid_call(call, WEATHER if call.function.name == "get_weather" else TIME)
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        **GREEDY,
    )
    (call,) = r.choices[0].message.tool_calls
    assert valid_call(call, TIME)["zone"] in ("UTC", "CET", "PST")


def test_streamed_call_deltas_reassemble_to_the_whole_call(client, forced) -> None:
    calls: dict[int, list[str]] = {}
    finish = None
    pieces = 0
    for chunk in client.chat.completions.create(stream=True, **FORCED):
        for tc in chunk.choices[0].delta.tool_calls or ():
            if tc.id:
                assert tc.index not in calls and tc.type == "function"
                calls[tc.index] = [tc.function.name, ""]
            else:
                pieces += 1
            calls[tc.index][1] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    whole = forced.choices[0].message.tool_calls[0]
    assert finish == "tool_calls" and list(calls) == [0] and pieces >= 2  # the arguments came in pieces
    assert calls[0] == [whole.function.name, whole.function.arguments]


def test_a_tool_result_round_trips_and_auto_answers_or_calls(client, forced) -> None:
    call = forced.choices[0].message
    history = ASK + [
        call.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.tool_calls[0].id,
            "content": json.dumps({"temperature": 21, "sky": "sunny"}),
        },
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER, TIME], tool_choice="auto", **GREEDY
    )
    # the call and its result are in the prompt now: it grew by more than the call's own tokens
    assert r.usage.prompt_tokens > forced.usage.prompt_tokens + forced.usage.completion_tokens
    message = r.choices[0].message
    if message.tool_calls:  # auto: the model may call again; a call names a real function
        assert r.choices[0].finish_reason in ("tool_calls", "length")
        assert all(c.function.name in ("get_weather", "get_time") for c in message.tool_calls)
    else:
        assert message.content and r.choices[0].finish_reason in ("stop", "length")
