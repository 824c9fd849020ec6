"""Hostile JSON schemas (response_format, forced tool calls) cost bounded time and memory: each is refused with a
one-line ConstraintError (a 400), or compiles within the limits and generates a bounded reply.  The
bounds are written in backends/constrained/grammar.py (size, depth), finite.py (a schema only an endless document
satisfies) and compiler.py (llguidance's fuel).  A limit hit mid-reply: tests/constrained/test_constraint_limits.py."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from backends.api import Constraint, FinishReason, LoadOptions, Request, SamplingParams
from backends.constrained import MAX_SCHEMA_BYTES, check_constraint, check_finite, schema_constraint
from backends.errors import ConstraintError, InvalidRequestError
from tests.constrained.tiny import tiny_build, tiny_compiler, tiny_spec

BOUND_S = 10.0  # far above what any case takes (< 1 s here); a runaway compile would take minutes or forever


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


REFUSED = {
    "larger than the size bound": (
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(4000)}},
        f"at most {MAX_SCHEMA_BYTES}",
    ),
    "nested deeper than the bound": (nested(200), "levels deep"),
    "a $ref cycle that admits no value": (
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        r"no JSON value satisfies the schema: .*\$ref cycle that never reaches a schema",
    ),
    "an unimplemented keyword": ({"type": "string", "not": {"const": "x"}}, "Unimplemented"),
    "an unsatisfiable schema": ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "Unsatisfiable"),
    "a $ref that points nowhere": ({"$ref": "#/$defs/missing"}, "cannot be compiled"),
}

ENDLESS = "no finite JSON value satisfies the schema"


def recursive(**extra) -> dict:
    """An object whose required "a" is itself (plus `extra` properties, all required)."""
    properties = {**extra, "a": {"$ref": "#"}}
    return {"type": "object", "properties": properties, "required": list(properties)}


# schemas only an endless document satisfies (issue 29): refused where the schema is compiled, never mid-reply
REFUSED.update(
    {
        "a required property that $refs its own object": (recursive(), ENDLESS),
        "the same after a property the model writes": (recursive(b={"type": "integer"}), ENDLESS),
        "a required self-reference through $defs": (
            {
                "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
                "$ref": "#/$defs/n",
            },
            ENDLESS,
        ),
        "an array that needs an item like itself": ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, ENDLESS),
        "an object and an array that need each other": (
            {
                "$defs": {
                    "o": {"type": "object", "properties": {"b": {"$ref": "#/$defs/l"}}, "required": ["b"]},
                    "l": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/o"}},
                },
                "$ref": "#/$defs/o",
            },
            ENDLESS,
        ),
        "a tuple whose first item is itself": (
            {"type": "array", "prefixItems": [{"$ref": "#"}, {"type": "integer"}], "minItems": 1},
            ENDLESS,
        ),
        "every anyOf branch recursive": (
            {
                "type": "object",
                "properties": {
                    "a": {"anyOf": [{"$ref": "#"}, {"type": "array", "minItems": 1, "items": {"$ref": "#"}}]}
                },
                "required": ["a"],
            },
            ENDLESS,
        ),
        "recursion through a patternProperties key": (
            {"type": "object", "patternProperties": {"^a$": {"$ref": "#"}}, "required": ["a"]},
            ENDLESS,
        ),
        "recursion through allOf": (
            {"type": "object", "properties": {"a": {"allOf": [{"$ref": "#"}]}}, "required": ["a"]},
            ENDLESS,
        ),
    }
)


@pytest.fixture(scope="module")
def compiler():
    return tiny_compiler()


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_hostile_schemas_are_refused_with_one_line(compiler, case: str) -> None:
    schema, message = REFUSED[case]
    constraint = Constraint("json_schema", json.dumps(schema))
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequestError, match=message) as info:
        compiler.matcher(constraint)
    assert time.perf_counter() - t0 < BOUND_S
    assert "\n" not in info.value.one_line() and len(info.value.one_line()) < 600
    assert isinstance(info.value, ConstraintError)  # typed: front ends answer it as a 400 naming the field


@pytest.mark.parametrize("case", [c for c in REFUSED if REFUSED[c][1] == ENDLESS])
def test_an_endless_schema_is_refused_without_a_model(case: str) -> None:
    """The front ends' check (no vocabulary: the server and `hearth run` before a model loads) refuses it too,
    in a few milliseconds, naming where the schema loops."""
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError, match=ENDLESS) as info:
        schema_constraint(REFUSED[case][0])
    assert time.perf_counter() - t0 < 1.0
    assert "leads back to #" in info.value.message and info.value.hint


def test_a_long_chain_of_refs_is_decided_quickly() -> None:
    """700 definitions each needing the next (57 kB): ending in an integer it is accepted, looping back it is
    refused, each within the bound (one pass in dependency order, not one pass per definition)."""
    defs = {f"d{i}": {"type": "array", "minItems": 1, "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(700)}
    chain = {"$defs": {**defs, "d700": {"type": "integer"}}, "$ref": "#/$defs/d0"}
    t0 = time.perf_counter()
    check_finite(chain)
    chain["$defs"]["d700"] = {"$ref": "#/$defs/d0"}
    with pytest.raises(ConstraintError, match=ENDLESS):
        check_finite(chain)
    assert time.perf_counter() - t0 < BOUND_S


def test_a_text_nested_100k_levels_is_refused_without_recursion() -> None:
    text = "[" * 100_000 + "]" * 100_000  # 200 kB: past the size bound; nested() would hit the depth bound too
    with pytest.raises(InvalidRequestError, match="bytes"):
        check_constraint(Constraint("json_schema", text))
    deep = '{"a":' * 5000 + "1" + "}" * 5000  # 30 kB, 5000 levels: refused by the linear depth scan
    with pytest.raises(InvalidRequestError, match="5000 levels deep"):
        check_constraint(Constraint("json_schema", deep))


BOUNDED = {
    # recursive schemas that a finite value satisfies stay accepted: the recursion is optional or has an end
    "optional self-reference": {"type": "object", "properties": {"a": {"$ref": "#"}}},
    "self-reference or null": {
        "type": "object",
        "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["a"],
    },
    "nullable recursive object": {"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "an untyped schema (a string satisfies it)": {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "nested lists": {"type": "array", "items": {"$ref": "#"}},
    "a required key no recursive pattern matches": {
        "type": "object",
        "patternProperties": {"^b": {"$ref": "#"}},
        "required": ["a"],
    },
    "recursive tree": {
        "$defs": {"n": {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
        "$ref": "#/$defs/n",
    },
    "regex with nested quantifiers": {"type": "string", "pattern": "^(a+)+b$"},
    "many alternatives": {"anyOf": [nested(8) for _ in range(100)]},
    "a large enum": {"enum": ["".join(p) for p in itertools.product("ab01", repeat=6)]},  # 4096 strings
}


@pytest.mark.parametrize("case", BOUNDED, ids=list(BOUNDED))
def test_expensive_but_legal_schemas_compile_and_generate_within_bounds(case: str) -> None:
    from backends.torch_engine.backend import TorchBackend

    constraint = Constraint("json_schema", json.dumps(BOUNDED[case]))
    with TorchBackend(tiny_spec(), LoadOptions(n_ctx=256, n_batch=64, max_num_seqs=4), build=tiny_build()) as b:
        t0 = time.perf_counter()
        c = b.generate(
            Request(
                prompt_token_ids=(1, 2), constraint=constraint, sampling=SamplingParams(temperature=0, max_tokens=48)
            )
        )
        assert time.perf_counter() - t0 < BOUND_S
    assert c.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), c.error
    if c.finish_reason is FinishReason.STOP:
        json.loads(c.text)
