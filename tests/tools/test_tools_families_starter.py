"""Each family's forced call on a real backend: the starter model (llama.cpp) given a Hermes/Qwen-, Llama 3- and
Mistral-style template that renders tools itself, tool_choice "required": the constrained reply carries the
family's prefix and suffix, reads back through the family's parser as one call, and its arguments validate
against the function's schema.  (The starter's own ChatML is covered through the server in
test_tools_starter.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.requests import chat_request
from backends.api import LoadOptions, SamplingParams
from backends.tools import tool_request_from_openai
from tests.tools import templates as T

pytestmark = [pytest.mark.slow]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def llama(starter_path):
    from backends.llama_cpp.backend import LlamaCppBackend
    from backends.modelspec import load_spec

    backend = LlamaCppBackend(load_spec(starter_path), LoadOptions(n_ctx=1024))
    backend.load()
    yield backend
    backend.close()


@pytest.mark.parametrize("template", [T.HERMES, T.LLAMA3, T.MISTRAL], ids=["hermes", "llama3", "mistral"])
def test_forced_call_in_each_family_format(llama, template) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    spec = dataclasses.replace(llama.spec, chat_template=template)
    built = chat_request(
        spec,
        ASK,
        SamplingParams(temperature=0, seed=1, max_tokens=80),
        tools=tool_request_from_openai([WEATHER], "required"),
    )
    assert '"get_weather"' in built.request.prompt and "# Tools\n\nYou may call" not in built.request.prompt
    done = llama.generate(built.request)
    constraint = built.request.constraint
    assert done.finish_reason.value == "stop", done.text
    assert done.text.startswith(constraint.prefix) and done.text.endswith(constraint.suffix)
    parser = built.tools.parser()
    parser.feed(done.text)
    parser.finish()
    (call,) = parser.calls
    assert call.name == "get_weather" and parser.text == ""
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
