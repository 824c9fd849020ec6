"""The tool-call formats: each one's calls written and read back, whole and streamed in arbitrary pieces."""

from __future__ import annotations

import json
import random

import pytest

from backends.api import ToolCall
from backends.tools import CallDelta, HermesFormat, Llama3Format, MistralFormat, TextDelta, ToolCallParser, parse_reply

FORMATS = [HermesFormat(), Llama3Format(), MistralFormat()]
CALLS = [
    ToolCall("call_1", "get_weather", '{"city": "Paris", "days": [1, 2], "note": "a \\"quoted\\" }"}'),
    ToolCall("call_2", "no_args", "{}"),
]


def calls_of(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def streamed(fmt, text: str, seed: int, **kw) -> tuple[str, list[ToolCall], list]:
    """Feed `text` in random pieces of 1-6 characters; rebuild text and calls from the deltas alone."""
    rng = random.Random(seed)
    parser = ToolCallParser(fmt, **kw)
    deltas = []
    i = 0
    while i < len(text):
        k = rng.randint(1, 6)
        deltas += parser.feed(text[i : i + k])
        i += k
    deltas += parser.finish()
    content = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, CallDelta):
            if d.id is not None:
                assert d.index not in calls and d.name and d.arguments == ""  # first piece: id, name, no args
                calls[d.index] = [d.id, d.name, ""]
            else:
                calls[d.index][2] += d.arguments
    assert sorted(calls) == list(range(len(calls)))
    return content, [ToolCall(*calls[i]) for i in sorted(calls)], deltas


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_calls_written_by_a_format_parse_back_whole_and_streamed(fmt) -> None:
    text = fmt.calls_text(CALLS)
    content, calls = parse_reply(fmt, text)
    assert content == "" and calls_of(calls) == calls_of(CALLS)
    for seed in range(25):
        s_content, s_calls, _ = streamed(fmt, text, seed)
        assert s_content == "" and calls_of(s_calls) == calls_of(CALLS)


def test_hermes_text_around_calls_is_content_and_blanks_before_a_call_are_dropped() -> None:
    fmt = HermesFormat()
    text = "Let me check.\n\n" + fmt.calls_text(CALLS[:1]) + "\n" + fmt.calls_text(CALLS[1:]) + "\n"
    content, calls = parse_reply(fmt, text)
    assert content == "Let me check." and calls_of(calls) == calls_of(CALLS)
    for seed in range(25):
        assert streamed(fmt, text, seed)[:2][0] == "Let me check."


@pytest.mark.parametrize(
    "text",
    [
        "Plain answer, no call.",
        "a <tool_c",
        'x <tool_call>{"name": 3}</tool_call> y',
        "<tool_call>not json</tool_call>",
        "less < than <tool_call",
        "  spaced  \n",
    ],
)
def test_hermes_text_that_is_no_call_is_kept_exactly(text) -> None:
    fmt = HermesFormat()
    assert parse_reply(fmt, text) == (text, [])
    for seed in range(10):
        content, calls, _ = streamed(fmt, text, seed)
        assert (content, calls) == (text, [])


def test_a_marker_split_across_pieces_is_held_back_until_known() -> None:
    parser = ToolCallParser(HermesFormat())
    assert parser.feed("Hi <tool") == [TextDelta("Hi")]  # "<tool" may start a call: held, with the blank
    assert parser.feed("box>") == [TextDelta(" <toolbox>")]  # it did not: released
    out = parser.feed(' <tool_call>{"name": "f", "arguments": {"a": 1')
    assert out[0] == CallDelta(0, "", id=parser.calls[0].id, name="f") and out[1] == CallDelta(0, '{"a": 1')


def test_arguments_stream_in_pieces_that_concatenate_to_the_call() -> None:
    fmt = HermesFormat()
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
    _, calls, deltas = streamed(fmt, text, seed=3)
    pieces = [d.arguments for d in deltas if isinstance(d, CallDelta) and d.id is None]
    assert len(pieces) > 3 and "".join(pieces) == '{"city": "Paris", "days": [1, 2]}' == calls[0].arguments


def test_keys_in_another_order_are_read_when_the_object_is_complete() -> None:
    content, calls = parse_reply(HermesFormat(), '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>')
    assert content == "" and calls_of(calls) == [("f", {"x": 1})]
    _, calls = parse_reply(HermesFormat(), '<tool_call>{"name": "f"}</tool_call>')  # no arguments at all
    assert calls_of(calls) == [("f", {})]


def test_quoted_arguments_are_decoded() -> None:
    _, calls = parse_reply(HermesFormat(), '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert calls_of(calls) == [("f", {"x": 1})]


def test_a_call_cut_off_by_max_tokens_keeps_its_arguments_so_far() -> None:
    content, calls = parse_reply(HermesFormat(), '<tool_call>\n{"name": "f", "arguments": {"city": "Par')
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"city": "Par')]


def test_an_object_cut_off_before_its_name_is_text() -> None:
    assert parse_reply(HermesFormat(), '<tool_call>\n{"na') == ('<tool_call>\n{"na', [])


def test_max_calls_keeps_only_the_first() -> None:
    text = HermesFormat().calls_text(CALLS)
    content, calls = parse_reply(HermesFormat(), text, max_calls=1)
    assert content == "" and calls_of(calls) == calls_of(CALLS[:1])


def test_llama3_bare_json_and_python_tag_and_semicolons() -> None:
    fmt = Llama3Format()
    _, calls = parse_reply(fmt, ' {"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}')
    assert calls_of(calls) == [("f", {"a": 1}), ("g", {})]
    _, calls = parse_reply(fmt, '<|python_tag|>{"name": "f", "parameters": {"a": 1}}')
    assert calls_of(calls) == [("f", {"a": 1})]


@pytest.mark.parametrize("text", ['{"answer": 42} is the JSON you asked for', "[1, 2] and more", "Sure {not json"])
def test_llama3_json_that_is_no_call_is_text(text) -> None:
    assert parse_reply(Llama3Format(), text) == (text, [])
    for seed in range(10):
        assert streamed(Llama3Format(), text, seed)[:2] == (text, [])


def test_mistral_array_with_and_without_its_control_token() -> None:
    fmt = MistralFormat()
    body = '[{"name": "f", "arguments": {"a": "x]"}}, {"name": "g", "arguments": {}}]'
    for text in ("[TOOL_CALLS]" + body, body, "[TOOL_CALLS] " + body):
        content, calls = parse_reply(fmt, text)
        assert content == "" and calls_of(calls) == [("f", {"a": "x]"}), ("g", {})]
    assert parse_reply(fmt, "[Note] plain text") == ("[Note] plain text", [])
    assert all(len(c.id) == 9 and c.id.isalnum() for c in parse_reply(fmt, "[TOOL_CALLS]" + body)[1])


def test_forced_reply_may_start_with_the_json_without_its_marker() -> None:
    text = '{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert calls_of(parse_reply(HermesFormat(), text, forced=True)[1]) == [("f", {"a": 1})]
    assert parse_reply(HermesFormat(), text)[1] == []  # unforced, bare JSON is text for Hermes


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_one_character_at_a_time_with_escapes_and_brackets_inside_strings(fmt) -> None:
    tricky = ToolCall("c", "write", json.dumps({"text": 'a\\"}] {[ \\\\" \\n', "n": [{"k": "}"}]}))
    text = fmt.calls_text([tricky, CALLS[1]])
    parser = ToolCallParser(fmt)
    for ch in text:
        parser.feed(ch)
    parser.finish()
    assert parser.text == "" and calls_of(parser.calls) == calls_of([tricky, CALLS[1]])
