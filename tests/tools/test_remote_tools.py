"""Tools through the remote backend, against hearth's own server (a FakeBackend whose reply holds calls): the
server parses the calls and streams them as delta.tool_calls; the remote backend writes them back into its
text (Hermes format) and hearth's parser reads the same calls; the tools and a tool-call history reach the
server as OpenAI sends them."""

from __future__ import annotations

import json

import pytest

from app.requests import chat_request
from app.server.background import BackgroundServer
from backends.api import EventKind, SamplingParams
from backends.remote.backend import RemoteBackend
from backends.remote.spec import RemoteTarget, remote_spec
from backends.remote.tool_text import ToolCallText
from backends.tools import CallDelta, HermesFormat, parse_reply, tool_request_from_openai
from tests.fakes import loaded_fake

pytestmark = pytest.mark.server

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)


def test_tool_call_deltas_become_hermes_text_the_parser_reads_back() -> None:
    text = ToolCallText()
    out = text.feed([{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": ""}}])
    out += text.feed([{"index": 0, "function": {"arguments": '{"x": '}}])
    out += text.feed([{"index": 0, "function": {"arguments": "1}"}}])
    out += text.feed([{"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}])
    out += text.close()  # g sent no arguments: written as {}
    _, calls = parse_reply(HermesFormat(), out)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]


def test_tools_pass_through_a_remote_backend_and_read_back_as_calls() -> None:
    fake = loaded_fake(replies=[TWO_CALLS])
    inner = BackgroundServer(fake, "inner-model")
    remote = RemoteBackend(
        remote_spec("inner-model", inner.url), None, RemoteTarget(inner.url, "inner-model", None, "the test")
    )
    remote.load()
    try:
        history = [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "19 C"},
            {"role": "user", "content": "And Paris and Oslo?"},
        ]
        built = chat_request(
            remote.spec,
            history,
            SamplingParams(temperature=0, max_tokens=64),
            tools=tool_request_from_openai([WEATHER], "auto"),
        )
        assert built.request.constraint is None  # the remote server forces calls itself
        reply = built.tools.parser()
        deltas = []
        for event in remote.stream(built.request):
            if event.kind is EventKind.TOKEN:
                deltas += reply.feed(event.text)
        deltas += reply.finish()
        assert [json.loads(c.arguments)["city"] for c in reply.calls] == ["Paris", "Oslo"]
        assert reply.text == "" and sum(isinstance(d, CallDelta) and d.id is not None for d in deltas) == 2
        sent = fake.requests[-1]  # what the inner server got: the history with its call and result, the tools
        assert sent.messages[1].tool_calls[0].name == "get_weather" and sent.messages[2].tool_call_id == "call_0"
        assert "get_weather" in sent.prompt and "<tool_response>\n19 C\n</tool_response>" in sent.prompt
        assert '"parameters"' in sent.prompt  # the tools were rendered by the inner server
    finally:
        remote.close()
        inner.stop()
