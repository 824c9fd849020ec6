"""The tool the tool-calling tests share: a weather lookup, and the Hermes-style call a fake model answers with.
Tests that need a stricter schema (enums, length limits, additionalProperties) keep their own variant."""

from __future__ import annotations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
