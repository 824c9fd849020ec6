"""OpenAI's `response_format` on /v1/chat/completions and /v1/completions, as a backend `Constraint`.

`{"type": "text"}` (or none): free text.  `{"type": "json_object"}`: any JSON object.  `{"type": "json_schema",
"json_schema": {"name", "description", "schema", "strict"}}`: a JSON value valid against `schema` (OpenAI's
structured outputs; the openai SDK's `chat.completions.parse(response_format=PydanticModel)` sends this).  Both
JSON kinds are enforced by constrained decoding, whatever `strict` says: the reply always parses, and validates
unless max_tokens cuts it (finish_reason "length").  A bad one is a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from app.server.errors import APIError
from backends.api import Constraint
from backends.errors import InvalidRequestError


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: StrictStr | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")  # absent = any JSON value
    strict: StrictBool | None = None  # hearth always enforces the schema


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def constraint_of(response_format: ResponseFormat | None) -> Constraint | None:
    """The Constraint a response_format asks for (None for text); APIError 400 naming the field."""
    if response_format is None or response_format.type == "text":
        if response_format is not None and response_format.json_schema is not None:
            raise _bad("response_format.json_schema", 'json_schema is only taken with type "json_schema"')
        return None
    if response_format.type == "json_object":
        if response_format.json_schema is not None:
            raise _bad("response_format.json_schema", 'json_schema is only taken with type "json_schema"')
        return Constraint("json_object")
    spec = response_format.json_schema
    if spec is None:
        raise _bad(
            "response_format.json_schema",
            'type "json_schema" needs a json_schema object ({"name": ..., "schema": {...}})',
        )
    schema = spec.schema_ if spec.schema_ is not None else {}
    from backends.constrained import check_constraint

    constraint = Constraint("json_schema", json.dumps(schema))
    try:
        check_constraint(constraint)  # size and depth bounds, then llguidance's check: before a model sees it
    except InvalidRequestError as exc:
        raise _bad("response_format.json_schema.schema", exc.one_line()) from None
    return constraint


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_response_format")
