"""Masks on a tiny vocabulary: what a constraint allows at each step, the end (only EOS), refusals, the compile
cache, the sampler's mask step, and the grammar text built from a Constraint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from backends.api import Constraint
from backends.constrained import ConstraintViolation, check_schema, lark_grammar
from backends.torch_engine.grammar_mask import apply_grammar_masks, unpack_bitmask
from tests.constrained.tiny import EOS, PIECES, VOCAB, TinyTokenizer, tiny_compiler

TOK = TinyTokenizer()
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
)


def allowed(matcher) -> set[str]:
    return {PIECES[i] for i in range(VOCAB) if matcher.allowed()[i]}


@pytest.fixture(scope="module")
def compiler():
    return tiny_compiler()


def test_json_object_starts_with_a_brace_and_ends_with_eos_only(compiler) -> None:
    m = compiler.matcher(Constraint("json_object"))
    assert allowed(m) == {"{", '{"'}  # compact JSON: no leading whitespace
    for t in TOK.encode('{"a":1}'):
        assert m.allowed()[t]
        m.accept(t)
    assert m.is_finished
    assert allowed(m) == {"<eos>"}
    m.accept(EOS)


def test_a_schema_allows_only_its_keys_and_types(compiler) -> None:
    m = compiler.matcher(Constraint("json_schema", SCHEMA))
    for t in TOK.encode('{"a":'):
        m.accept(t)
    assert allowed(m) <= {"0", "1", "2", "9"} and "true" not in allowed(m)
    for t in TOK.encode('12,"b":'):
        m.accept(t)
    assert allowed(m) == {"true", "false"}
    for t in TOK.encode("true}"):
        m.accept(t)
    assert allowed(m) == {"<eos>"}


def test_a_forbidden_token_is_refused(compiler) -> None:
    m = compiler.matcher(Constraint("json_schema", SCHEMA))
    with pytest.raises(ConstraintViolation, match="breaks the constraint"):
        m.accept(TOK.encode("x")[0])


def test_prefix_and_suffix_are_literal_text_around_the_json(compiler) -> None:
    m = compiler.matcher(Constraint("json_object", prefix="<x>", suffix="ab"))
    assert allowed(m) == {"<"}
    text = '<x>{"b":null}ab'
    for t in TOK.encode(text):
        assert m.allowed()[t], (text, PIECES[t])
        m.accept(t)
    assert allowed(m) == {"<eos>"}


def test_compiled_grammars_are_cached_and_matchers_are_independent(compiler) -> None:
    c = Constraint("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}}))
    before = compiler.cached
    m1, m2 = compiler.matcher(c), compiler.matcher(c)
    assert compiler.cached == before + 1
    m1.accept(TOK.encode("[")[0])
    assert allowed(m2) == {"["} and "[" not in allowed(m1)


def test_the_mask_step_touches_constrained_rows_only(compiler) -> None:
    logits = torch.randn(3, VOCAB)
    assert apply_grammar_masks(logits, [None, None, None]) is logits
    assert apply_grammar_masks(logits, None) is logits
    m = compiler.matcher(Constraint("json_object"))
    out = apply_grammar_masks(logits, [None, m, None])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert torch.equal(torch.isfinite(out[1]), torch.from_numpy(m.allowed()))
    assert torch.equal(out[1][torch.isfinite(out[1])], logits[1][torch.from_numpy(m.allowed())])


def test_unpack_bitmask_reads_little_endian_bits_and_forbids_padding() -> None:
    words = np.array([[0b101, -(2**31)]], dtype=np.int32)  # tokens 0, 2 and 63
    bits = unpack_bitmask(words, 70)
    assert bits.shape == (1, 70)
    assert torch.nonzero(bits[0]).flatten().tolist() == [0, 2, 63]


def test_grammar_text_escapes_literals_and_asks_for_compact_json() -> None:
    text = lark_grammar(Constraint("json_object", prefix='say "hi"\n', suffix="\\end"))
    assert text.startswith('start: "say \\"hi\\"\\n" value "\\\\end"\n')
    assert '"whitespace_flexible": false' in text


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "an object or a boolean"),
        ("{not json", "not valid JSON"),
        ("false", None),
    ],
)
def test_check_schema_refuses_what_is_not_a_schema(text: str, message: str | None) -> None:
    from backends.errors import InvalidRequestError

    if message is None:
        assert check_schema(text) is False
        with pytest.raises(InvalidRequestError, match="no value is valid"):
            lark_grammar(Constraint("json_schema", text))
    else:
        with pytest.raises(InvalidRequestError, match=message):
            check_schema(text)


class _NothingAllowed:
    """A matcher whose grammar allows no token (what a broken grammar state would give)."""

    num_words = (VOCAB + 31) // 32

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        pass  # the buffer stays all zeros


def test_a_row_with_no_allowed_token_fails_alone() -> None:
    from backends.api import SamplingParams
    from backends.torch_engine.sampler import Sampler

    logits = torch.randn(2, VOCAB)
    greedy = SamplingParams(temperature=0)
    rows = Sampler().sample(logits, ["free", "stuck"], [greedy, greedy], [[1], [1]], matchers=[None, _NothingAllowed()])
    assert rows[0] == int(logits[0].argmax())
    assert isinstance(rows[1], ValueError) and "allows no next token" in str(rows[1])


def test_x_guidance_cannot_turn_on_lenient_mode() -> None:
    from backends.constrained import check_constraint
    from backends.errors import InvalidRequestError

    schema = {"type": "string", "not": {"const": "a"}, "x-guidance": {"lenient": True}}
    with pytest.raises(InvalidRequestError, match="Unimplemented"):
        check_constraint(Constraint("json_schema", json.dumps(schema)))
