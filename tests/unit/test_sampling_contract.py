"""The contract's sampling surface (penalties, logit_bias, logprobs, constraints): validated where it is built,
and refused by a backend that lacks the capability instead of being ignored."""

import pytest

from backends.api import MAX_LOGIT_BIAS, Capabilities, Constraint, Request, SamplingParams, TokenLogprob
from backends.errors import InvalidRequestError
from tests.fakes import FakeBackend


def test_logit_bias_dict_is_stored_sorted_and_hashable():
    sp = SamplingParams(logit_bias={7: 2.5, 3: -100})
    assert sp.logit_bias == ((3, -100), (7, 2.5))
    hash(sp)
    assert sp.penalized and not SamplingParams().penalized


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"logit_bias": {i: 1 for i in range(MAX_LOGIT_BIAS + 1)}}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs, word):
    with pytest.raises(InvalidRequestError, match=word):
        SamplingParams(**kwargs)


def test_constraint_kinds():
    Constraint("json_object")
    Constraint("json_schema", schema='{"type": "object"}', prefix="<tool_call>\n", suffix="\n</tool_call>")
    with pytest.raises(InvalidRequestError, match="kind"):
        Constraint("regex")
    with pytest.raises(InvalidRequestError, match="schema"):
        Constraint("json_schema")
    with pytest.raises(InvalidRequestError, match="schema"):
        Constraint("json_object", schema="{}")


def test_a_backend_without_the_capability_refuses_instead_of_ignoring():
    backend = FakeBackend.__new__(FakeBackend)
    backend.name = "fake"
    backend.capabilities = Capabilities()
    with pytest.raises(InvalidRequestError, match="constrained decoding"):
        backend.refuse_unsupported(Request(prompt="x", constraint=Constraint("json_object")))
    with pytest.raises(InvalidRequestError, match="log-probabilities"):
        backend.refuse_unsupported(Request(prompt="x", sampling=SamplingParams(logprobs=0)))
    backend.capabilities = Capabilities(constraints=True, logprobs=True)
    backend.refuse_unsupported(
        Request(
            prompt="x", constraint=Constraint("json_object"), sampling=SamplingParams(logprobs=2, prompt_logprobs=True)
        )
    )
    assert TokenLogprob(1, None).top == ()
