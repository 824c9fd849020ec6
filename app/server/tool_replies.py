"""A chat reply's tool calls in OpenAI's shapes: the whole message (non-streaming) and the stream deltas.

The parser (backends/tools/parser.py) splits the reply's text into text and call pieces; this module writes
them as OpenAI does: a message with `content` (null when the reply is only calls) and `tool_calls`
(`{id, type: "function", function: {name, arguments}}`), and in a stream `delta.tool_calls` entries: first
`{index, id, type, function: {name, arguments: ""}}`, then `{index, function: {arguments: PIECE}}`.  A reply
that made a call ends with finish_reason "tool_calls" (unless max_tokens cut it: "length").
"""

from __future__ import annotations

from typing import Any

from backends.tools.parser import CallDelta, Delta, TextDelta
from backends.tools.render import ToolReading


class ToolReply:
    def __init__(self, reading: ToolReading) -> None:
        self.parser = reading.parser()

    @property
    def called(self) -> bool:
        return bool(self.parser.calls)

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.called and reason == "stop" else reason

    def message(self, text: str) -> dict[str, Any]:
        """The assistant message of a whole reply."""
        self.parser.feed(text)
        self.parser.finish()
        message: dict[str, Any] = {"role": "assistant", "content": self.parser.text or None}
        if self.parser.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.parser.calls
            ]
        elif message["content"] is None:
            message["content"] = ""
        return message

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Stream deltas (`choices[0].delta` objects) for the next piece of reply text."""
        return _deltas(self.parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        return _deltas(self.parser.finish())


def _deltas(pieces: list[Delta]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for piece in pieces:
        if isinstance(piece, TextDelta):
            out.append({"content": piece.text})
        elif isinstance(piece, CallDelta):
            entry: dict[str, Any] = {"index": piece.index}
            if piece.id is not None:
                entry.update(id=piece.id, type="function", function={"name": piece.name, "arguments": ""})
            else:
                entry["function"] = {"arguments": piece.arguments}
            out.append({"tool_calls": [entry]})
    return out
