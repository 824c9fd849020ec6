"""Schemas the constraint library cannot serve are the client's 400, never a 500 (issue 29): one no finite
document satisfies is refused before the model sees it (response_format and a forced tool call alike), one only
the model's vocabulary shows is refused by the backend's compile and named the same way, and a reply stopped by
llguidance's limits mid-generation is a 400 `constraint_limit` (an error event when streaming) while the server
goes on serving."""

from __future__ import annotations

import dataclasses
import json
import time

import httpx
import pytest

from tests.constrained.tiny import tiny_build, tiny_spec
from tests.fakes import loaded_fake

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
ENDLESS = {"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}
SCHEMA_PARAM = "response_format.json_schema.schema"


def js(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}


def test_an_endless_schema_is_a_400_before_the_model_runs(live) -> None:
    backend = loaded_fake()
    backend.capabilities = dataclasses.replace(backend.capabilities, constraints=True)
    s = live(backend)
    tool = {"type": "function", "function": {"name": "nest", "parameters": ENDLESS}}
    with httpx.Client(base_url=s.url, timeout=30) as c:
        t0 = time.perf_counter()
        r = c.post(
            CHAT,
            json={
                "model": "fake-model",
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": js(ENDLESS),
            },
        )
        assert time.perf_counter() - t0 < 5
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == SCHEMA_PARAM, error
        assert "no finite JSON value satisfies the schema" in error["message"] and '"self"' in error["message"]
        r = c.post(
            CHAT,
            json={
                "model": "fake-model",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": "nest"}},
            },
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tools" and "no finite JSON value" in r.json()["error"]["message"]
    assert backend.requests == []  # neither reached the backend


@pytest.fixture
def tiny_torch():
    from backends.api import LoadOptions
    from backends.torch_engine.backend import TorchBackend

    with TorchBackend(tiny_spec(), LoadOptions(n_ctx=256, n_batch=64, max_num_seqs=4), build=tiny_build()) as b:
        yield b


def test_what_only_the_vocabulary_shows_is_a_400_naming_the_field(live, tiny_torch) -> None:
    """The tiny vocabulary has no "s": a required key "self" cannot be written with it, which the check before
    the model (no vocabulary) cannot know; the backend's compile refuses it, and the 400 names the field."""
    s = live(tiny_torch, model_name="tiny")
    schema = {"type": "object", "properties": {"self": {"type": "integer"}}, "required": ["self"]}
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2], "response_format": js(schema)})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == SCHEMA_PARAM and error["message"].startswith(SCHEMA_PARAM + ": "), error
        assert error["code"] == "invalid_response_format"


def test_a_limit_mid_reply_is_a_400_and_the_server_goes_on(live, tiny_torch, monkeypatch) -> None:
    import llguidance

    import backends.constrained.compiler as compiler

    monkeypatch.setattr(  # the limit lowered so that this schema reaches it a few tokens in (test_constraint_limits)
        compiler, "_parser_limits", lambda: llguidance.LLParserLimits(step_max_items=20, verbose_errors=False)
    )
    heavy = {"type": "object", "properties": {"a": {"type": "object"}}, "required": ["a"]}
    s = live(tiny_torch, model_name="tiny")
    body = {"model": "tiny", "prompt": [1, 2, 3], "temperature": 0, "max_tokens": 48, "response_format": js(heavy)}
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "constraint_limit" and error["param"] == SCHEMA_PARAM, error
        assert "step_max_items" in error["message"] and error["type"] == "invalid_request_error"
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
        assert [e["code"] for e in errors] == ["constraint_limit"] and "step_max_items" in errors[0]["message"]
        small = {"type": "integer", "minimum": 0, "maximum": 99}
        r = c.post("/v1/completions", json={**body, "response_format": js(small)})
        assert r.status_code == 200 and 0 <= json.loads(r.json()["choices"][0]["text"]) <= 99, r.text
