"""`hearth run --json-schema FILE` / `--json` as a person uses them: the reply validates, and a bad schema file is
one clean error line (exit 2) before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.e2e.test_cli import assert_clean_error, hearth

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "cannot read the JSON schema file"),
        ("{not json", "not valid JSON"),
        (json.dumps({"type": "string", "not": {}}), "Unimplemented"),
        ("[" * 40 + "]" * 40, "levels deep"),
        (  # only an endless document satisfies it (issue 29): refused before a model loads
            json.dumps({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}),
            "no finite JSON value satisfies the schema",
        ),
    ],
)
def test_a_bad_schema_file_is_one_clean_error(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    p = hearth("run", "--model", str(tmp_path / "never-loaded.gguf"), "--json-schema", str(path), "hi", timeout=60)
    assert_clean_error(p, match)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["llama.cpp", "torch"])
def test_run_json_schema_replies_with_valid_json(starter_path: Path, tmp_path: Path, backend: str) -> None:
    path = tmp_path / "person.json"
    path.write_text(json.dumps(SCHEMA))
    p = hearth(
        "run",
        "-t",
        "0",
        "-n",
        "64",
        "--backend",
        backend,
        "--ctx",
        "1024",
        "--json-schema",
        str(path),
        "Invent a person with a name and an age.",
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    jsonschema.validate(json.loads(p.stdout), SCHEMA)
    p = hearth(
        "run",
        "-t",
        "0",
        "-n",
        "64",
        "--backend",
        backend,
        "--ctx",
        "1024",
        "--json",
        "Describe a cat as JSON.",
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert isinstance(json.loads(p.stdout), dict)
