"""Tools reach the model: the family is detected from the template, tools and tool-call history are rendered by
the model's own template when it can (the template's call text parses back to the same call), else in hearth's
Hermes-style system block; a forced choice carries the constraint of the family's format."""

from __future__ import annotations

import json

import pytest

from app.requests import chat_request
from backends.api import SamplingParams, ToolCall
from backends.tools import parse_reply, tool_request_from_openai
from backends.tools.detect import detect
from tests.fakes import fake_spec
from tests.tool_fixtures import WEATHER
from tests.tools import templates as T

CALL_ID = "abcDEF123"  # nine letters and digits: Mistral's templates insist
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "22 C, sunny"},
    {"role": "user", "content": "And tomorrow?"},
]


def build(template, messages=HISTORY, choice=None, tools=(WEATHER,), parallel=None):
    spec = fake_spec(chat_template=template)
    return chat_request(
        spec, messages, SamplingParams(temperature=0), tools=tool_request_from_openai(list(tools), choice, parallel)
    )


@pytest.mark.parametrize(
    "template,family,native",
    [
        (T.HERMES, "hermes", True),
        (T.LLAMA3, "llama3", True),
        (T.MISTRAL, "mistral", True),
        (T.CHATML_NO_TOOLS, "hermes", False),
        (None, "hermes", False),
    ],
)
def test_family_is_detected_from_the_template(template, family, native) -> None:
    style = detect(template, "llama")
    assert (style.format.name, style.native) == (family, native)


# where each template writes the assistant's call turn: (text before it, text after it)
CALL_TURN = {
    "hermes": ("Weather in Paris?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"),
    "llama3": ("Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral": ("[/INST]", "</s>"),
}


@pytest.mark.parametrize("template", [T.HERMES, T.LLAMA3, T.MISTRAL])
def test_native_templates_render_tools_and_history_and_their_call_text_parses_back(template) -> None:
    built = build(template)
    prompt = built.request.prompt
    assert "get_weather" in prompt and "Current weather of a city" in prompt  # the tools, as the template shows them
    assert "22 C, sunny" in prompt and "# Tools\n\nYou may call" not in prompt  # not hearth's fallback block
    fmt = built.tools.format
    before, after = CALL_TURN[fmt.name]
    turn = prompt.split(before, 1)[1].split(after, 1)[0]
    # the assistant's call, as the model's own template wrote it, reads back to the same call
    content, calls = parse_reply(fmt, turn)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    m = built.request.messages
    assert m[2].tool_calls == (ToolCall(CALL_ID, "get_weather", '{"city": "Paris"}'),)
    assert (m[3].role, m[3].tool_call_id, m[3].name) == ("tool", CALL_ID, "get_weather")


def test_a_template_without_tools_gets_the_hermes_block_and_calls_as_text() -> None:
    built = build(T.CHATML_NO_TOOLS)
    prompt = built.request.prompt
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
    assert json.dumps(WEATHER) in prompt
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>"
    ) in prompt
    assert "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>" in prompt
    assert built.tools.format.name == "hermes" and built.request.constraint is None  # auto: parsed afterwards


def test_consecutive_tool_results_share_one_user_turn() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}} for i in range(2)
    ]
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c0", "content": "one"},
        {"role": "tool", "tool_call_id": "c1", "content": "two"},
    ]
    prompt = build(T.CHATML_NO_TOOLS, messages).request.prompt
    assert (
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response><|im_end|>"
    ) in prompt


def test_choice_none_renders_no_tools_but_keeps_the_history() -> None:
    built = build(T.CHATML_NO_TOOLS, choice="none")
    assert "# Tools" not in built.request.prompt and "<tool_response>" in built.request.prompt
    assert built.tools is None and built.request.constraint is None
    built = build(T.HERMES, choice="none")
    assert "<tools>" not in built.request.prompt


@pytest.mark.parametrize(
    "template,prefix,suffix",
    [(T.CHATML_NO_TOOLS, "<tool_call>\n", "\n</tool_call>"), (T.LLAMA3, "", ""), (T.MISTRAL, "[TOOL_CALLS]", "")],
)
def test_forced_choices_carry_the_family_constraint(template, prefix, suffix) -> None:
    second = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}},
        },
    }
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        built = build(template, choice=choice, tools=(WEATHER, second))
        c = built.request.constraint
        assert (c.kind, c.prefix, c.suffix) == ("json_schema", prefix, suffix)
        assert built.tools.forced and built.tools.max_calls == 1
        schema = json.loads(c.schema)
        names = json.dumps(schema)
        assert ("get_weather" in names) == (choice == "required") and "get_time" in names


def test_parallel_false_reads_one_call() -> None:
    assert build(T.HERMES, parallel=False).tools.max_calls == 1
    assert build(T.HERMES).tools.max_calls is None


def test_a_plain_conversation_is_unchanged_by_the_tool_machinery() -> None:
    spec = fake_spec(chat_template=T.CHATML_NO_TOOLS)
    msgs = [{"role": "user", "content": "hi"}]
    built = chat_request(spec, msgs, SamplingParams())
    assert built.request.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert built.tools is None and built.request.constraint is None and built.request.tools is None


def test_a_template_that_does_not_render_tools_is_read_as_hermes_whatever_its_family() -> None:
    llama3_without_tools = T.LLAMA3.replace("{%- if tools %}", "{%- if false %}").replace(
        "{% for t in tools %}", "{% for t in [] %}"
    )
    assert detect(llama3_without_tools, "llama").format.name == "hermes"
    assert not detect(llama3_without_tools, "llama").native
    unknown = "{% if tools %}<|tool|>{{ tools | tojson }}<|/tool|>{% endif %}{{ messages[0].content }}"
    assert (detect(unknown).format.name, detect(unknown).native) == ("hermes", False)


def test_a_template_that_refuses_system_messages_gets_the_block_in_the_first_user_turn() -> None:
    no_system = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not "
        "supported') }}{% endif %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    built = build(no_system, messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert built.request.prompt.startswith("<start_of_turn>user\n# Tools\n\nYou may call")
    assert "Weather in Paris?<end_of_turn>" in built.request.prompt
    from backends.errors import TemplateError

    with pytest.raises(TemplateError):  # the user's own system message is still refused, as without tools
        build(no_system, messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
