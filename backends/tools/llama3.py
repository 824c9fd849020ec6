"""Llama 3.1 / 3.2 / 3.3 tool calls: a JSON object `{"name": ..., "parameters": {...}}` as the whole reply,
after `<|python_tag|>` or bare (the templates ask for bare JSON; llama.cpp hides the control token anyway).
Several calls are separated by `;` (what vLLM's llama3_json parser accepts)."""

from __future__ import annotations

from collections.abc import Sequence

from backends.api import ToolCall
from backends.tools.base import ToolFormat


class Llama3Format(ToolFormat):
    name = "llama3"
    starts = ("<|python_tag|>",)
    end = None
    bare_starts = "{"
    args_key = "parameters"
    forced_prefix = ""
    forced_suffix = ""

    def calls_text(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(self.call_json(c) for c in calls)
