"""What a request says about tools: the functions on offer (ToolDef), how the model may use them (ToolRequest),
built from OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` and checked field by field.

A bad value raises ToolRequestError (an InvalidRequestError: exit 2, a 400 under the server) whose `param` is
the OpenAI field at fault ("tools[1].function.name", "tool_choice"), so the server can name it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.errors import InvalidRequestError

MAX_TOOLS = 128  # OpenAI's limit on functions in one request
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("auto", "none", "required", "function")
EMPTY_PARAMETERS = '{"type": "object", "properties": {}}'  # a function that takes no arguments


class ToolRequestError(InvalidRequestError):
    """A malformed `tools` / `tool_choice` / tool message; `param` names the field (OpenAI's error param)."""

    def __init__(self, message: str, param: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.param = param


@dataclass(frozen=True)
class ToolDef:
    """One function the model may call (OpenAI's `{"type": "function", "function": {...}}`)."""

    name: str
    description: str = ""
    parameters: str = EMPTY_PARAMETERS  # its JSON Schema as JSON text (hashable; keys in the client's order)

    def schema(self) -> dict[str, Any]:
        return json.loads(self.parameters)

    def openai(self) -> dict[str, Any]:
        """The OpenAI / Hugging Face chat-template form: what templates that render tools expect."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.schema()
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one chat request and the client's choice.

    choice "auto": the model may answer or call (its reply is parsed after generation); "none": the tools are
    not rendered at all; "required": exactly one call to one of the tools, forced by constrained decoding;
    "function": exactly one call to `function`, forced the same way.  `parallel` False keeps only the first
    call of an "auto" reply (a forced choice always makes exactly one)."""

    tools: tuple[ToolDef, ...]
    choice: str = "auto"
    function: str | None = None  # choice "function": the function's name
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.choice not in CHOICES:
            raise ToolRequestError(
                f"tool_choice must be auto, none, required or a function, got {self.choice!r}", "tool_choice"
            )
        if (self.choice == "function") != (self.function is not None):
            raise ToolRequestError(
                "a named tool_choice needs the function's name, and only it takes one", "tool_choice"
            )
        names = [t.name for t in self.tools]
        if self.choice in ("required", "function") and not self.tools:
            raise ToolRequestError(f"tool_choice {self.choice!r} needs at least one tool in `tools`", "tool_choice")
        if self.function is not None and self.function not in names:
            raise ToolRequestError(
                f"tool_choice names the function {self.function!r}, which is not in tools "
                f"({', '.join(names) or 'none'})",
                "tool_choice.function.name",
            )

    @property
    def forced(self) -> tuple[ToolDef, ...]:
        """The tools a forced choice may call; () for auto and none."""
        if self.choice == "required":
            return self.tools
        if self.choice == "function":
            return tuple(t for t in self.tools if t.name == self.function)
        return ()

    @property
    def rendered(self) -> bool:
        """Whether the model is told about the tools at all."""
        return bool(self.tools) and self.choice != "none"


def _function_field(i: int, tool: Any) -> Mapping[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping):
        raise ToolRequestError(f"{where} must be an object, got {type(tool).__name__}", where)
    if tool.get("type", "function") != "function":
        raise ToolRequestError(f"{where}.type must be 'function', got {tool.get('type')!r}", f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise ToolRequestError(f"{where}.function must be an object with a name", f"{where}.function")
    return function


def tool_def_from_openai(i: int, tool: Any) -> ToolDef:
    """One element of OpenAI's `tools` array as a ToolDef (ToolRequestError naming the field when malformed)."""
    function = _function_field(i, tool)
    where = f"tools[{i}].function"
    name = function.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ToolRequestError(f"{where}.name must be 1-64 letters, digits, '_' or '-', got {name!r}", f"{where}.name")
    description = function.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise ToolRequestError(f"{where}.description must be a string", f"{where}.description")
    parameters = function.get("parameters")
    if parameters is None:
        return ToolDef(name, description)
    if not isinstance(parameters, Mapping):
        raise ToolRequestError(
            f"{where}.parameters must be a JSON Schema object, got {type(parameters).__name__}", f"{where}.parameters"
        )
    kind = parameters.get("type", "object")
    if kind != "object":
        raise ToolRequestError(
            f"{where}.parameters must describe an object (type 'object'), got type {kind!r}", f"{where}.parameters.type"
        )
    return ToolDef(name, description, json.dumps(parameters, ensure_ascii=False))


def tool_request_from_openai(
    tools: Sequence[Any] | None, tool_choice: Any = None, parallel_tool_calls: bool | None = None
) -> ToolRequest | None:
    """OpenAI's three fields as a ToolRequest; None when the request has no tools and no choice that needs them.

    tool_choice defaults as OpenAI's: "auto" with tools, "none" without."""
    if tools is not None and not isinstance(tools, Sequence):
        raise ToolRequestError("tools must be an array of function tools", "tools")
    defs = tuple(tool_def_from_openai(i, t) for i, t in enumerate(tools or ()))
    if len(defs) > MAX_TOOLS:
        raise ToolRequestError(f"tools has {len(defs)} functions; at most {MAX_TOOLS} are allowed", "tools")
    seen: set[str] = set()
    for i, d in enumerate(defs):
        if d.name in seen:
            raise ToolRequestError(f"tools[{i}].function.name {d.name!r} is given twice", f"tools[{i}].function.name")
        seen.add(d.name)
    choice, function = _choice(tool_choice, bool(defs))
    if not defs and choice == "none":
        return None
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    if not isinstance(parallel, bool):
        raise ToolRequestError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return ToolRequest(defs, choice, function, parallel)


def _choice(tool_choice: Any, have_tools: bool) -> tuple[str, str | None]:
    if tool_choice is None:
        return ("auto" if have_tools else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ToolRequestError(
                f"tool_choice must be 'auto', 'none', 'required' or "
                f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}",
                "tool_choice",
            )
        return tool_choice, None
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise ToolRequestError(
                "tool_choice.function.name must be the name of a function in tools", "tool_choice.function.name"
            )
        return "function", name
    raise ToolRequestError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        "tool_choice",
    )
