"""A conversation with tools, as the chat template takes it; and what to read the reply with.

`message_from_dict` turns one OpenAI-style message (tool_calls with JSON-text arguments, tool_call_id) into a
ChatMessage, the seam every front end and the runner protocol carry.  `template_inputs` turns ChatMessages back
into the dicts and variables a template renders:

- native style (the template renders tools): messages in the Hugging Face form (assistant `tool_calls` with
  `function.arguments` as an object, tool messages with `tool_call_id` and `name`) and `tools=` in OpenAI's form;
- hearth's Hermes-style fallback (a template without tool support, or none): the tools as a block appended to
  the system message (a system message is added when there is none; a template that refuses system messages
  gets the block at the top of the first user message instead), an assistant's calls written into its
  text as `<tool_call>` blocks, and tool results as a user turn of `<tool_response>` blocks (consecutive results
  share one turn), so any template renders them.

tool_choice "none" renders no tools (history with calls is still written, in the same way).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.api import ChatMessage, Constraint, ToolCall
from backends.tools.base import ToolFormat
from backends.tools.detect import ToolStyle
from backends.tools.hermes import fallback_system_block, tool_response_text
from backends.tools.parser import ToolCallParser
from backends.tools.spec import ToolRequest, ToolRequestError


@dataclass(frozen=True)
class ToolReading:
    """How to read a reply's tool calls back: the format, and what the request allowed."""

    format: ToolFormat
    forced: bool  # a forced choice: the reply is one call (constrained)
    max_calls: int | None  # 1 when parallel_tool_calls is false or the choice is forced; None = any

    def parser(self) -> ToolCallParser:
        return ToolCallParser(self.format, max_calls=self.max_calls, forced=self.forced)


def reading_for(style: ToolStyle, tools: ToolRequest) -> ToolReading | None:
    if not tools.rendered:
        return None
    forced = bool(tools.forced)
    return ToolReading(style.format, forced, 1 if forced or not tools.parallel else None)


def constraint_for(style: ToolStyle, tools: ToolRequest) -> Constraint | None:
    """The constraint that forces a call for "required" / a named function; None for auto and none."""
    return style.format.constraint(tools.forced) if tools.forced else None


def message_from_dict(i: int, m: Mapping[str, Any]) -> ChatMessage:
    """One checked message dict (role, content text, maybe tool fields) as a ChatMessage."""
    calls = m.get("tool_calls") or ()
    if calls and m["role"] != "assistant":
        raise ToolRequestError(
            f"messages[{i}] has tool_calls but role {m['role']!r}; only assistant messages make calls",
            f"messages[{i}].tool_calls",
        )
    tool_calls = tuple(_call_from_dict(i, j, c) for j, c in enumerate(calls))
    call_id = m.get("tool_call_id")
    name = m.get("name")
    if m["role"] == "tool" and not isinstance(call_id, str):
        raise ToolRequestError(
            f"messages[{i}] (tool) needs tool_call_id: the id of the call it answers", f"messages[{i}].tool_call_id"
        )
    return ChatMessage(
        m["role"],
        m["content"],
        tool_calls,
        call_id if m["role"] == "tool" else None,
        name if m["role"] == "tool" and isinstance(name, str) else None,
    )


def _call_from_dict(i: int, j: int, call: Any) -> ToolCall:
    where = f"messages[{i}].tool_calls[{j}]"
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ToolRequestError(f"{where} needs function.name", f"{where}.function.name")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = call.get("id")
    return ToolCall(call_id if isinstance(call_id, str) else f"call_{i}_{j}", function["name"], arguments)


def has_tool_fields(messages: Sequence[ChatMessage]) -> bool:
    return any(m.tool_calls or m.role == "tool" for m in messages)


def template_inputs(
    messages: Sequence[ChatMessage], style: ToolStyle, tools: ToolRequest | None, system_role: bool = True
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages as template dicts, extra template variables).  `system_role` False (a template that refuses
    system messages): hearth's tool block opens the first user message instead."""
    render_tools = tools is not None and tools.rendered
    if style.native:
        extra = {"tools": [t.openai() for t in tools.tools]} if render_tools and tools is not None else {}
        return [_native(m) for m in messages], extra
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            text = tool_response_text(m.content)
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool_turn": True})
        elif m.tool_calls:
            calls = style.format.calls_text(m.tool_calls)
            out.append({"role": m.role, "content": f"{m.content}\n{calls}" if m.content else calls})
        else:
            out.append({"role": m.role, "content": m.content})
    for d in out:
        d.pop("_tool_turn", None)
    if render_tools and tools is not None:
        block = fallback_system_block(tools.tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        elif not system_role:
            first = next((d for d in out if d["role"] == "user"), None)
            if first is None:
                out.insert(0, {"role": "user", "content": block})
            else:
                first["content"] = f"{block}\n\n{first['content']}"
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, {}


def _native(m: ChatMessage) -> dict[str, Any]:
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_object(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
    return d


def _arguments_object(arguments: str) -> Any:
    """Templates print arguments with `| tojson`: give them the object (text that is not JSON stays text)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
