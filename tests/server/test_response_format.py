"""response_format over HTTP: bad ones are a 400 naming the field (scripted FakeBackend, no model), and a JSON
schema is enforced end to end by the torch engine (fake model over the tiny vocabulary of tests/constrained)."""

from __future__ import annotations

import dataclasses
import json

import httpx
import jsonschema
import pytest

from backends.api import Constraint, LoadOptions
from tests.constrained.tiny import tiny_build, tiny_spec
from tests.fakes import loaded_fake as fake

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def chat(response_format) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "response_format": response_format}


def js(schema=SCHEMA, **kw) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, **kw}}


BAD = [
    ("unknown type", {"type": "xml"}, "response_format.type"),
    ("not an object", "json", "response_format"),
    ("json_schema without its object", {"type": "json_schema"}, "response_format.json_schema"),
    (
        "json_schema with json_object",
        {"type": "json_object", "json_schema": {"name": "x"}},
        "response_format.json_schema",
    ),
    ("a name with spaces", js(name="my thing"), "response_format.json_schema.name"),
    ("strict not a bool", js(strict="yes"), "response_format.json_schema.strict"),
    (
        "schema not an object",
        {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
        "response_format.json_schema.schema",
    ),
    ("unimplemented keyword", js({"type": "string", "not": {"const": "a"}}), "response_format.json_schema.schema"),
    ("schema over the size bound", js({"enum": ["x" * 70_000]}), "response_format.json_schema.schema"),
    ("an unknown field", {"type": "json_object", "grammar": "root ::= x"}, "response_format.grammar"),
]


def test_bad_response_formats_get_a_400_naming_the_field(live) -> None:
    backend = fake()
    # the fake records the constraint it is given; it must say it takes one, or it refuses the request
    backend.capabilities = dataclasses.replace(backend.capabilities, constraints=True)
    s = live(backend)
    with httpx.Client(base_url=s.url) as c:
        for name, rf, param in BAD:
            r = c.post(CHAT, json=chat(rf))
            assert r.status_code == 400, (name, r.text)
            assert r.json()["error"]["param"] == param, (name, r.json())
        assert backend.requests == []  # nothing bad reached the backend
        assert c.post(CHAT, json=chat({"type": "text"})).status_code == 200
        assert backend.requests[-1].constraint is None
        assert c.post(CHAT, json=chat(js())).status_code == 200
        assert backend.requests[-1].constraint == Constraint("json_schema", json.dumps(SCHEMA))


@pytest.fixture
def tiny_torch():
    from backends.torch_engine.backend import TorchBackend

    with TorchBackend(tiny_spec(), LoadOptions(n_ctx=256, n_batch=64, max_num_seqs=4), build=tiny_build()) as b:
        yield b


def test_a_json_schema_is_enforced_and_a_cut_says_length(live, tiny_torch) -> None:
    s = live(tiny_torch, model_name="tiny")
    body = {"model": "tiny", "prompt": [1, 2, 3], "temperature": 0, "max_tokens": 64}
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/v1/completions", json={**body, "response_format": js()})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["text"]), SCHEMA)
        r = c.post("/v1/completions", json={**body, "max_tokens": 3, "response_format": {"type": "json_object"}})
        assert r.json()["choices"][0]["finish_reason"] == "length"
