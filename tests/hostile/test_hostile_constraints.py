"""Hostile JSON schemas (response_format, forced tool calls) cost bounded time and memory: each is refused with a
one-line InvalidRequestError (a 400), or compiles within the limits and generates a bounded reply.  The
bounds are written in backends/constrained/grammar.py (size, depth) and compiler.py (llguidance's fuel)."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from backends.api import Constraint, FinishReason, LoadOptions, Request, SamplingParams
from backends.constrained import MAX_SCHEMA_BYTES, check_constraint
from backends.errors import InvalidRequestError
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


def test_a_text_nested_100k_levels_is_refused_without_recursion() -> None:
    text = "[" * 100_000 + "]" * 100_000  # 200 kB: past the size bound; nested() would hit the depth bound too
    with pytest.raises(InvalidRequestError, match="bytes"):
        check_constraint(Constraint("json_schema", text))
    deep = '{"a":' * 5000 + "1" + "}" * 5000  # 30 kB, 5000 levels: refused by the linear depth scan
    with pytest.raises(InvalidRequestError, match="5000 levels deep"):
        check_constraint(Constraint("json_schema", deep))


BOUNDED = {
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
