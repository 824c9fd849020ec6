"""The torch engine with constrained requests on a fake model over the tiny vocabulary: constrained rows give
valid JSON and end with STOP, a max_tokens cut ends with LENGTH, and unconstrained requests in the same batch
produce exactly what they produce alone."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import jsonschema
import pytest

from backends.api import Constraint, FinishReason, LoadOptions, Request, SamplingParams
from backends.errors import InvalidRequestError
from backends.torch_engine.backend import TorchBackend
from tests.constrained.tiny import VOCAB, tiny_build, tiny_spec

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
PROMPTS = [(1, 4, 5), (2, 2), (7, 8, 9, 10), (3,)]


def drain(events) -> SimpleNamespace:
    """A stream's text, token ids, finish reason and error."""
    text, ids, last = [], [], None
    for e in events:
        text.append(e.text)
        ids.extend(e.token_ids)
        last = e
    return SimpleNamespace(text="".join(text), token_ids=tuple(ids), finish_reason=last.finish_reason, error=last.error)


def sampling(i: int, max_tokens: int = 64) -> SamplingParams:
    if i % 2:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=i, max_tokens=max_tokens)


@pytest.fixture(params=[VOCAB, VOCAB + 7], ids=["vocab", "padded-vocab"])
def backend(request):
    with TorchBackend(
        tiny_spec(), LoadOptions(n_ctx=256, n_batch=64, max_num_seqs=8), build=tiny_build(vocab=request.param)
    ) as b:
        yield b


def test_constrained_and_free_requests_share_a_batch(backend) -> None:
    free = {
        f"free-{i}": Request(prompt_token_ids=p, sampling=sampling(i, 24), request_id=f"free-{i}")
        for i, p in enumerate(PROMPTS)
    }
    alone = {rid: backend.generate(r).token_ids for rid, r in free.items()}
    kinds = [
        Constraint("json_schema", json.dumps(SCHEMA)),
        Constraint("json_object"),
        Constraint("json_schema", json.dumps(SCHEMA), prefix="<x>", suffix=">"),
    ]
    constrained = {
        f"json-{i}": Request(prompt_token_ids=p, sampling=sampling(i), request_id=f"json-{i}", constraint=kinds[i % 3])
        for i, p in enumerate(PROMPTS)
    }
    # stream() queues each request in the engine before returning: all eight are queued before any is drained,
    # so they overlap in the batch whatever the threads' timing
    streams = {r.request_id: backend.stream(r) for r in [*constrained.values(), *free.values()]}
    results = {}
    threads = [
        threading.Thread(target=lambda rid=rid, events=events: results.__setitem__(rid, drain(events)))
        for rid, events in streams.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    steps = backend._parts.runner.steps
    assert any(len({s.request_id[:4] for s in out.scheduled}) == 2 for out in steps)  # mixed batches ran
    for rid, req in constrained.items():
        c = results[rid]
        assert c.finish_reason is FinishReason.STOP, (rid, c.text, c.error)
        text = c.text
        if req.constraint.prefix:
            assert text.startswith("<x>") and text.endswith(">")
            text = text[3:-1]
        value = json.loads(text)
        if req.constraint.kind == "json_schema":
            jsonschema.validate(value, SCHEMA)
        else:
            assert isinstance(value, dict)
    for rid in free:
        assert results[rid].token_ids == alone[rid], rid


def test_a_max_tokens_cut_ends_with_length_and_a_prefix_of_valid_json(backend) -> None:
    c = backend.generate(
        Request(
            prompt_token_ids=(1, 2, 3),
            sampling=SamplingParams(temperature=0, max_tokens=3),
            constraint=Constraint("json_schema", json.dumps(SCHEMA)),
        )
    )
    assert c.finish_reason is FinishReason.LENGTH
    assert len(c.token_ids) == 3 and c.text.startswith('{"')


def test_ignore_eos_does_not_run_past_the_end_of_the_json(backend) -> None:
    c = backend.generate(
        Request(
            prompt_token_ids=(4,),
            constraint=Constraint("json_object"),
            sampling=SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
        )
    )
    assert c.finish_reason is FinishReason.STOP
    assert isinstance(json.loads(c.text), dict)


def test_a_schema_that_cannot_compile_is_refused_before_anything_runs(backend) -> None:
    steps = len(backend._parts.runner.steps)
    with pytest.raises(InvalidRequestError, match="Unimplemented keys"):
        backend.stream(Request(prompt_token_ids=(1,), constraint=Constraint("json_schema", '{"not": {}}')))
    assert len(backend._parts.runner.steps) == steps
