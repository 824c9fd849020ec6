"""OpenAI's tools / tool_choice / parallel_tool_calls checked field by field; the forced-call schemas accept
exactly the calls the tools allow; tool messages cross the runner protocol unchanged."""

from __future__ import annotations

import json

import pytest

from backends.api import ChatMessage, Request, ToolCall
from backends.tools import HermesFormat, Llama3Format, MistralFormat, ToolRequestError, tool_request_from_openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: takes none


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        ([{"type": "function"}], None, "tools[0].function"),
        ([{"type": "retrieval", "function": {"name": "x"}}], None, "tools[0].type"),
        ([{"type": "function", "function": {"name": "has space"}}], None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], None, "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            None,
            "tools[0].function.parameters.type",
        ),
        ([{"type": "function", "function": {"name": "f", "parameters": [1]}}], None, "tools[0].function.parameters"),
        ([WEATHER, WEATHER], None, "tools[1].function.name"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
        ([WEATHER], {"type": "function"}, "tool_choice.function.name"),
        ([], "required", "tool_choice"),
        (None, {"type": "function", "function": {"name": "get_weather"}}, "tool_choice"),
    ],
)
def test_malformed_tools_name_the_field(tools, choice, param) -> None:
    with pytest.raises(ToolRequestError) as err:
        tool_request_from_openai(tools, choice)
    assert err.value.param == param and err.value.exit_code == 2


def test_defaults_follow_openai() -> None:
    assert tool_request_from_openai(None) is None and tool_request_from_openai([], "none") is None
    r = tool_request_from_openai([WEATHER, TIME])
    assert (r.choice, r.parallel, r.rendered, r.forced) == ("auto", True, True, ())
    assert json.loads(r.tools[1].parameters) == {"type": "object", "properties": {}}
    r = tool_request_from_openai([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, False)
    assert (r.choice, r.function, r.parallel, [t.name for t in r.forced]) == (
        "function",
        "get_time",
        False,
        ["get_time"],
    )
    assert not tool_request_from_openai([WEATHER], "none").rendered


@pytest.mark.parametrize("fmt", [HermesFormat(), Llama3Format(), MistralFormat()], ids=lambda f: f.name)
def test_forced_schema_accepts_exactly_valid_calls(fmt) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    tools = tool_request_from_openai([WEATHER, TIME], "required").forced
    schema = json.loads(fmt.constraint(tools).schema)
    key = fmt.args_key

    def value(call: dict):
        return [call] if fmt.name == "mistral" else call

    good = [
        {"name": "get_weather", key: {"city": "Paris"}},
        {"name": "get_weather", key: {"city": "Oslo", "days": 2}},
        {"name": "get_time", key: {}},
    ]
    bad = [
        {"name": "get_weather", key: {}},
        {"name": "get_weather", key: {"city": "Paris", "days": 0}},
        {"name": "get_weather", key: {"city": 3}},
        {"name": "other", key: {}},
        {"name": "get_weather", key: {"city": "Paris"}, "extra": 1},
        {"name": "get_time"},
    ]
    for call in good:
        jsonschema.validate(value(call), schema)
        # and the parser reads the constrained text back to the same call
        text = fmt.forced_prefix + json.dumps(value(call)) + fmt.forced_suffix
        from backends.tools import parse_reply

        (c,) = parse_reply(fmt, text, forced=True)[1]
        assert (c.name, json.loads(c.arguments)) == (call["name"], call[key])
    for call in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value(call), schema)
    if fmt.name == "mistral":
        with pytest.raises(jsonschema.ValidationError):  # one call exactly
            jsonschema.validate([good[0], good[2]], schema)


def test_tool_messages_cross_the_runner_protocol_unchanged() -> None:
    import msgspec

    from backends.runner import protocol as p

    messages = (
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", "22 C", tool_call_id="call_1", name="get_weather"),
    )
    msg = p.Stream(Request(prompt="x", messages=messages, tools=json.dumps([WEATHER]), tool_choice='"auto"'))
    back = msgspec.msgpack.Decoder(p.ToRunner).decode(msgspec.msgpack.Encoder().encode(msg))
    assert back == msg and hash(back.request.messages) == hash(messages)


def test_old_style_messages_still_build() -> None:
    """Conversations saved before tool calls (role + content) load as they were."""
    m = ChatMessage("assistant", "hello")
    assert (m.tool_calls, m.tool_call_id, m.name) == ((), None, None)
    assert ChatMessage("assistant", "", [ToolCall("a", "f", "{}")]).tool_calls == (ToolCall("a", "f", "{}"),)
