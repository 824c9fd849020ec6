"""A remote server's tool calls, written back into the reply text in hearth's Hermes format.

Hearth's Backend contract streams text; a remote server (vLLM, llama.cpp's server, OpenAI) parses tool calls
itself and sends them as `delta.tool_calls`.  The remote backend writes each call into the text as
`<tool_call>\n{"name": NAME, "arguments": ARGUMENTS}\n</tool_call>`, arguments as they stream, and hearth's own
parser (backends/tools, the Hermes format the request builder chooses for remote models) reads them back, so
the front ends handle remote and local calls one way.  Call ids are hearth's own (the parser's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


class ToolCallText:
    def __init__(self) -> None:
        self._open: int | None = None  # index of the call being written
        self._has_args = False

    def feed(self, tool_calls: Sequence[Any] | None) -> str:
        """Text for one delta's `tool_calls` entries."""
        out = []
        for entry in tool_calls or ():
            if not isinstance(entry, Mapping):
                continue
            function = entry.get("function") if isinstance(entry.get("function"), Mapping) else {}
            index = entry.get("index", 0)
            name = function.get("name")
            if index != self._open and isinstance(name, str):
                out.append(self.close())
                out.append('<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
                self._open, self._has_args = index, False
            arguments = function.get("arguments")
            if self._open is not None and isinstance(arguments, str) and arguments:
                out.append(arguments)
                self._has_args = True
        return "".join(out)

    def close(self) -> str:
        """Text that ends the call being written (at the next call or at the end of the reply)."""
        if self._open is None:
            return ""
        self._open = None
        return ("" if self._has_args else "{}") + "}\n</tool_call>\n"
