"""The tool parts of chat request bodies (OpenAI's shapes): `tools`, a named `tool_choice`, and an assistant
message's `tool_calls`.  Their meaning is checked afterwards by backends/tools/spec.py (names, schemas)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, StrictBool, StrictStr


class FunctionCall(BaseModel):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(BaseModel):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict | None = None  # a JSON Schema object
    strict: StrictBool | None = None  # accepted; a forced call is always held to the schema


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: StrictStr


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction
