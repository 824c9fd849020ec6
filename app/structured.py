"""Structured replies from the CLI and the TUI: the `json_output` setting as a backend `Constraint`.

`json_output` (Settings; `hearth run --json` / `--json-schema FILE`; the TUI's F3 panel; `json_output` in
settings.toml): None or "" = free text; "object" = any JSON object; anything else = the path of a JSON Schema
file (write ./object for a file of that name).  The reply is then constrained token by token to JSON valid
against the schema (backends/constrained), as the server's response_format does.
"""

from __future__ import annotations

from pathlib import Path

from backends.api import Constraint
from backends.constrained import schema_constraint
from backends.constrained.grammar import MAX_SCHEMA_BYTES
from backends.errors import ConstraintError
from hwprobe.errors import ConfigError

JSON_OBJECT = "object"


def constraint_for(json_output: str | None) -> Constraint | None:
    """The Constraint for a json_output setting; ConfigError (exit 2) naming the file when it cannot be read or
    is not a schema hearth can enforce."""
    if not json_output:
        return None
    if json_output == JSON_OBJECT:
        return Constraint("json_object")
    path = Path(json_output).expanduser()
    try:
        size = path.stat().st_size
        if size > MAX_SCHEMA_BYTES:
            raise ConfigError(
                f"{path}: the JSON schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are allowed",
                "send a smaller schema",
            )
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the JSON schema file {path}: {getattr(exc, 'strerror', None) or exc}",
            "pass a readable JSON Schema file to --json-schema (or --json for any JSON object)",
        ) from None

    try:  # the checks the server makes on response_format, before any model loads (exit 2)
        return schema_constraint(text)
    except ConstraintError as exc:
        raise ConfigError(f"{path}: {exc.message}", exc.hint) from None
