"""Hermes / Qwen tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call.

The format of NousResearch's Hermes 2/3 and of Qwen 2.5 / Qwen 3 templates, and the one hearth uses for a
template that cannot render tools itself (see `fallback_system_block`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from backends.api import ToolCall
from backends.tools.base import ToolFormat
from backends.tools.spec import ToolDef


class HermesFormat(ToolFormat):
    name = "hermes"
    starts = ("<tool_call>",)
    end = "</tool_call>"
    bare_starts = ""
    args_key = "arguments"
    forced_prefix = "<tool_call>\n"
    forced_suffix = "\n</tool_call>"

    def calls_text(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f"<tool_call>\n{self.call_json(c)}\n</tool_call>" for c in calls)


def fallback_system_block(tools: Sequence[ToolDef]) -> str:
    """The tools as hearth writes them into the system message of a template without tool support (the text
    Qwen 2.5's template writes, so models trained on Hermes-style calls recognise it)."""
    lines = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def tool_response_text(content: str) -> str:
    """A tool result as a Hermes-style template shows it to the model (in a user turn)."""
    return f"<tool_response>\n{content}\n</tool_response>"
