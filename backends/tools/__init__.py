"""Tool calling: the tools of a request (spec), the call formats of the template families (one module each:
hermes, llama3, mistral), which one a model uses (detect), the messages and tools a template renders
(render), and the parser that reads calls back out of a reply, incrementally for streaming (parser)."""

from backends.tools.base import ToolFormat
from backends.tools.hermes import HermesFormat
from backends.tools.llama3 import Llama3Format
from backends.tools.mistral import MistralFormat
from backends.tools.parser import CallDelta, TextDelta, ToolCallParser, parse_reply
from backends.tools.spec import ToolDef, ToolRequest, ToolRequestError, tool_request_from_openai

__all__ = [
    "CallDelta",
    "HermesFormat",
    "Llama3Format",
    "MistralFormat",
    "TextDelta",
    "ToolCallParser",
    "ToolDef",
    "ToolFormat",
    "ToolRequest",
    "ToolRequestError",
    "parse_reply",
    "tool_request_from_openai",
]
