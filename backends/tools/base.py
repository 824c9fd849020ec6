"""ToolFormat: how one family of chat templates writes tool calls, and the constraint that forces one.

A format knows three things: the markers that open a call in the model's reply (`starts`, and `end` where the
family closes one), the JSON object of one call (`call_object`: which key holds the arguments), and how an
assistant's calls look as text (`calls_text`, for history in a template that cannot render them itself).
Everything else (incremental parsing, constraints, rendering) is shared and lives beside this module.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Sequence
from typing import Any, ClassVar

from backends.api import Constraint, ToolCall
from backends.tools.spec import ToolDef


class ToolFormat:
    name: ClassVar[str] = "abstract"
    starts: ClassVar[tuple[str, ...]] = ()  # markers that open a call region in the reply
    end: ClassVar[str | None] = None  # marker that closes a region; None = the region runs to the reply's end
    # a reply whose first non-blank character is one of these is a call region without a marker (Llama 3 writes
    # bare JSON; llama.cpp hides control tokens such as <|python_tag|> and [TOOL_CALLS] from the reply text)
    bare_starts: ClassVar[str] = ""
    args_key: ClassVar[str] = "arguments"  # the key of a call object that holds the arguments
    # constraint text around the forced JSON value (the call object, or what wraps it)
    forced_prefix: ClassVar[str] = ""
    forced_suffix: ClassVar[str] = ""

    def call_object_schema(self, tool: ToolDef) -> dict[str, Any]:
        """JSON Schema of one call to `tool`: its name fixed, its arguments valid for its parameters."""
        return {
            "type": "object",
            "properties": {"name": {"const": tool.name}, self.args_key: tool.schema()},
            "required": ["name", self.args_key],
            "additionalProperties": False,
        }

    def forced_schema(self, tools: Sequence[ToolDef]) -> dict[str, Any]:
        """The JSON value a forced choice must write: one call to one of `tools`."""
        calls = [self.call_object_schema(t) for t in tools]
        return calls[0] if len(calls) == 1 else {"anyOf": calls}

    def constraint(self, tools: Sequence[ToolDef]) -> Constraint:
        """The constraint for tool_choice "required" (all tools) or a named function (that one)."""
        return Constraint(
            "json_schema",
            schema=json.dumps(self.forced_schema(tools), ensure_ascii=False),
            prefix=self.forced_prefix,
            suffix=self.forced_suffix,
        )

    def call_json(self, call: ToolCall) -> str:
        return json.dumps({"name": call.name, self.args_key: _arguments_value(call.arguments)}, ensure_ascii=False)

    def calls_text(self, calls: Sequence[ToolCall]) -> str:
        """An assistant message's calls written as the model would write them."""
        raise NotImplementedError

    def new_call_id(self) -> str:
        return "call_" + secrets.token_hex(12)


def _arguments_value(arguments: str) -> Any:
    """Arguments JSON text as a value (a dict normally); text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def alnum_id(length: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))
