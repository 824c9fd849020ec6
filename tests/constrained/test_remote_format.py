"""The remote backend passes a constraint to its server as OpenAI's response_format, and refuses one it cannot
express (literal text around the JSON) instead of dropping it."""

from __future__ import annotations

import json

import pytest

from backends.api import ChatMessage, Constraint, Request
from backends.errors import InvalidRequestError
from backends.remote.backend import _body

HI = (ChatMessage("user", "hi"),)


def test_response_format_is_passed_through() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    _, body = _body("m", Request(prompt="x", messages=HI, constraint=Constraint("json_schema", json.dumps(schema))))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema, "strict": True},
    }
    _, body = _body("m", Request(prompt="x", constraint=Constraint("json_object")))
    assert body["response_format"] == {"type": "json_object"}
    _, body = _body("m", Request(prompt="x", messages=HI))
    assert "response_format" not in body


def test_literal_text_around_the_json_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="cannot add literal text"):
        _body("m", Request(prompt="x", messages=HI, constraint=Constraint("json_object", prefix="<tool_call>")))
