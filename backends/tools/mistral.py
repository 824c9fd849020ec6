"""Mistral tool calls: `[TOOL_CALLS]` and a JSON array of `{"name": ..., "arguments": {...}}` objects (the v3
tokenizer's format, Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo / Small).  `[TOOL_CALLS]` is a control token,
which llama.cpp leaves out of the reply text, so a reply that starts with `[` is read as the array too.
Mistral's templates want call ids of exactly nine letters and digits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.api import ToolCall
from backends.tools.base import ToolFormat, alnum_id
from backends.tools.spec import ToolDef


class MistralFormat(ToolFormat):
    name = "mistral"
    starts = ("[TOOL_CALLS]",)
    end = None
    bare_starts = "["
    args_key = "arguments"
    forced_prefix = "[TOOL_CALLS]"
    forced_suffix = ""

    def forced_schema(self, tools: Sequence[ToolDef]) -> dict[str, Any]:
        return {"type": "array", "items": super().forced_schema(tools), "minItems": 1, "maxItems": 1}

    def calls_text(self, calls: Sequence[ToolCall]) -> str:
        return "[TOOL_CALLS]" + "[" + ", ".join(self.call_json(c) for c in calls) + "]"

    def new_call_id(self) -> str:
        return alnum_id(9)
