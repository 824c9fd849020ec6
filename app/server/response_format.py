"""OpenAI's `response_format` on /v1/chat/completions and /v1/completions, as a backend `Constraint`.

`{"type": "text"}` (or none): free text.  `{"type": "json_object"}`: any JSON object.  `{"type": "json_schema",
"json_schema": {"name", "description", "schema", "strict"}}`: a JSON value valid against `schema` (OpenAI's
structured outputs; the openai SDK's `chat.completions.parse(response_format=PydanticModel)` sends this).  Both
JSON kinds are enforced by constrained decoding, whatever `strict` says: the reply always parses, and validates
unless max_tokens cuts it (finish_reason "length").  A bad one is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from app.server.errors import APIError
from backends.api import Constraint, GenerationEvent, Request
from backends.constrained import schema_constraint
from backends.errors import ConstraintError

# GenerationEvent.error_code of a constrained request that hit llguidance's limits mid-reply (ConstraintLimitError)
CONSTRAINT_LIMIT = "constraint_limit"
# APIError.code that app/server/runner.py gives a ConstraintError the backend raised while compiling for its
# vocabulary; `named()` below turns it into the 400 of the field the schema came from
CONSTRAINT_REFUSED = "constraint_refused"


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

    try:  # size, depth, a schema no finite document satisfies, then llguidance's check: before a model sees it
        return schema_constraint(schema)
    except ConstraintError as exc:
        raise _bad("response_format.json_schema.schema", exc.one_line()) from None


def constraint_param(body: Any, request: Request) -> str | None:
    """The request field a constrained request's schema came from (named in its errors), None when it has none:
    response_format's schema, response_format itself (json_object), or a forced tool call's `tools`."""
    if request.constraint is None:
        return None
    response_format = getattr(body, "response_format", None)
    if response_format is not None and response_format.type == "json_schema":
        return "response_format.json_schema.schema"
    return "response_format" if response_format is not None and response_format.type == "json_object" else "tools"


def named(error: APIError, param: str | None) -> APIError:
    """A ConstraintError from the backend's own compile (what only the model's vocabulary shows) as the 400 of
    the field the schema came from, like the checks made before the model; any other error as it is."""
    if error.code != CONSTRAINT_REFUSED or param is None:
        return error
    code = "invalid_response_format" if param.startswith("response_format") else None
    return APIError(400, f"{param}: {error.message}", param=param, code=code)


def limit_error(event: GenerationEvent, param: str | None) -> APIError | None:
    """The 400 for a reply that stopped on llguidance's limits mid-generation (FINISHED with error_code
    "constraint_limit"): the schema is at fault, not the server, so never a 500; None for other events."""
    if event.error_code != CONSTRAINT_LIMIT:
        return None
    where = param or "response_format"
    return APIError(400, f"{where}: {event.error}", param=where, code=CONSTRAINT_LIMIT)


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_response_format")
