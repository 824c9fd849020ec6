"""Tools through the HTTP layer with the official openai client, against a scripted FakeBackend: the reply's
calls come back as tool_calls (whole and as stream deltas), a tool result goes back to the model, malformed
tools get a 400 naming the field, forced choices reach the backend as a constraint."""

from __future__ import annotations

import json

import httpx
import pytest

from app.server.background import BackgroundServer
from backends.api import Capabilities
from tests.fakes import FakeBackend, loaded_fake
from tests.tool_fixtures import WEATHER

pytestmark = pytest.mark.server

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def serve():
    servers = []

    def start(backend):
        servers.append(BackgroundServer(backend, "fake-model"))
        from openai import OpenAI

        return servers[-1], OpenAI(base_url=servers[-1].url + "/v1", api_key="x", max_retries=0, timeout=30)

    yield start
    for s in servers:
        s.stop()


def test_auto_call_whole_and_streamed_and_the_result_round_trip(serve) -> None:
    backend = loaded_fake(replies=["Checking.\n" + CALL, "It is 22 C in Paris."])
    _, client = serve(backend)
    r = client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}
    assert "# Tools" in backend.requests[-1].prompt  # ChatML without tool support: hearth's system block

    # the tool result goes back; the model answers in text
    history = ASK + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C"},
    ]
    r2 = client.chat.completions.create(model="fake-model", messages=history, tools=[WEATHER])
    assert r2.choices[0].message.content == "It is 22 C in Paris." and r2.choices[0].finish_reason == "stop"
    assert not r2.choices[0].message.tool_calls
    prompt = backend.requests[-1].prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>' in prompt
    assert "<tool_response>\n22 C\n</tool_response>" in prompt
    assert backend.requests[-1].messages[-1].tool_call_id == call.id


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(serve) -> None:
    backend = loaded_fake(replies=["Checking.\n" + CALL])
    _, client = serve(backend)
    chunks = list(client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], stream=True))
    content, calls, finish = "", {}, None
    for ch in chunks:
        delta = ch.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or ():
            if tc.id:
                assert tc.index not in calls and tc.type == "function" and tc.function.name == "get_weather"
                calls[tc.index] = ""
            calls[tc.index] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    arg_chunks = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or () if not tc.id]
    assert content == "Checking." and finish == "tool_calls" and len(arg_chunks) >= 2  # arguments came in pieces
    assert list(calls) == [0] and json.loads(calls[0]) == {"city": "Paris", "unit": "C"}


def test_parallel_calls_and_parallel_false(serve) -> None:
    two = CALL + "\n" + CALL.replace("Paris", "Oslo")
    backend = loaded_fake(replies=[two, two])
    _, client = serve(backend)
    r = client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == ["Paris", "Oslo"]
    assert r.choices[0].message.content is None
    r = client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1


def test_a_reply_without_a_call_is_plain_text(serve) -> None:
    _, client = serve(loaded_fake(replies=["No tool needed: it is <b>sunny</b>."]))
    r = client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    assert r.choices[0].message.content == "No tool needed: it is <b>sunny</b>." and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


class ConstrainedFake(FakeBackend):
    capabilities = Capabilities(constraints=True, logits=False)


def test_forced_choices_reach_the_backend_as_a_constraint(serve) -> None:
    backend = ConstrainedFake(replies=[CALL])
    backend.load()
    _, client = serve(backend)
    r = client.chat.completions.create(
        model="fake-model",
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    c = backend.requests[-1].constraint
    assert (c.kind, c.prefix, c.suffix) == ("json_schema", "<tool_call>\n", "\n</tool_call>")
    assert json.loads(c.schema)["properties"]["name"] == {"const": "get_weather"}
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert backend.requests[-1].constraint is None and "get_weather" not in backend.requests[-1].prompt


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools[0].function.parameters.type",
    ),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {  # a keyword the grammar lacks
                            "type": "object",
                            "properties": {"a": {"not": {"type": "string"}}},
                        },
                    },
                }
            ],
            "tool_choice": "required",
        },
        "tools",
    ),
    ({"messages": [{"role": "tool", "content": "22 C"}]}, "messages.0"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages.0"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ]
        },
        "messages[0].tool_calls",
    ),
]


@pytest.mark.parametrize("extra,param", BAD)
def test_malformed_tools_get_a_400_naming_the_field(serve, extra, param) -> None:
    server, _ = serve(loaded_fake())
    body = {"model": "fake-model", "messages": ASK, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
