"""A `Constraint` (backends/api.py) as a Lark grammar for llguidance, with the checks that keep a hostile schema
cheap: the schema's size and nesting depth are bounded here, before anything compiles it, a schema no finite
document satisfies is refused here (finite.py), and the compiler's own work is bounded by llguidance's limits
(backends/constrained/compiler.py).

The grammar is `prefix`, one JSON value, `suffix`: llguidance's Lark dialect embeds a JSON Schema with
`%json {...}`, so literal text around the JSON is one rule.  JSON is generated compact (no optional whitespace,
llguidance's `whitespace_flexible: false`): a small model allowed free whitespace can loop on newlines until
max_tokens, and compact JSON is what every parser reads.

Pure Python (no llguidance import): the server and the CLI check a schema with `check_schema` before a model runs.
"""

from __future__ import annotations

import json
from typing import Any

from backends.api import Constraint
from backends.constrained.finite import check_finite
from backends.errors import ConstraintError

MAX_SCHEMA_BYTES = 64 * 1024  # a schema's JSON text; a larger one is refused (OpenAI's own limits are smaller)
MAX_SCHEMA_DEPTH = 32  # nesting of objects/arrays in the schema's JSON text (llguidance's own limit is ~40)
MAX_AFFIX_CHARS = 4096  # a constraint's literal prefix / suffix
_JSON_OBJECT = {"type": "object"}
_HINT = "send a smaller or flatter JSON Schema"


def check_schema(text: str) -> Any:
    """The parsed schema, or ConstraintError (one line) when it is too big, too deep, not JSON, or not a
    schema (an object or a boolean)."""
    size = len(text.encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise ConstraintError(f"the JSON schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are allowed", _HINT)
    depth = _nesting_depth(text)
    if depth > MAX_SCHEMA_DEPTH:
        raise ConstraintError(
            f"the JSON schema nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are allowed", _HINT
        )
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConstraintError(
            f"the JSON schema is not valid JSON: {str(exc).splitlines()[0][:200]}", "send the schema as a JSON object"
        ) from None
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(
            f"a JSON schema is an object or a boolean, got {type(schema).__name__}", "send the schema as a JSON object"
        )
    return schema


def _nesting_depth(text: str) -> int:
    """The deepest nesting of [ and { outside JSON strings (a linear scan: no recursion on hostile input)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def lark_grammar(constraint: Constraint) -> str:
    """The constraint as llguidance Lark: `start: PREFIX json SUFFIX`.  Raises ConstraintError for a bad
    schema or an oversized prefix/suffix."""
    for name, value in (("prefix", constraint.prefix), ("suffix", constraint.suffix)):
        if len(value) > MAX_AFFIX_CHARS:
            raise ConstraintError(
                f"the constraint's {name} is {len(value)} characters; at most {MAX_AFFIX_CHARS} are allowed"
            )
    if constraint.kind == "json_schema":
        assert constraint.schema is not None  # Constraint.__post_init__
        schema = check_schema(constraint.schema)
    else:
        schema = dict(_JSON_OBJECT)
    if schema is True:
        schema = {}
    elif schema is False:
        raise ConstraintError(
            "the JSON schema is `false`: no value is valid against it", "send a schema some value satisfies"
        )
    check_finite(schema)  # a schema only an endless document satisfies: refused here, not mid-generation
    options = dict(schema.get("x-guidance") or {}) if isinstance(schema.get("x-guidance"), dict) else {}
    options.setdefault("whitespace_flexible", False)
    options["lenient"] = False  # an unimplemented keyword is refused, never skipped: the reply always validates
    schema = {**schema, "x-guidance": options}
    parts = [json.dumps(constraint.prefix)] if constraint.prefix else []
    parts.append("value")
    if constraint.suffix:
        parts.append(json.dumps(constraint.suffix))
    # json.dumps escapes quotes, backslashes and control characters the way Lark string literals read them
    return f"start: {' '.join(parts)}\nvalue: %json {json.dumps(schema)}\n"
