"""Both backends on the real starter model: a constrained reply parses and validates against its schema (greedy
and sampled, with a literal prefix/suffix too), and a max_tokens cut ends with LENGTH."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from backends.api import Constraint, FinishReason, LoadOptions, Request, SamplingParams

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 2},
        "coastal": {"type": "boolean"},
    },
    "required": ["city", "population", "landmarks", "coastal"],
    "additionalProperties": False,
}
PROMPT = (
    "<|im_start|>user\nDescribe Paris as JSON with its population, up to two landmarks and whether it is "
    "coastal.<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def backend(request, starter_path: Path):
    from backends.modelspec import load_spec

    spec = load_spec(starter_path)
    if request.param == "torch":
        pytest.importorskip("backends.torch_engine.model_runner")
        from backends.torch_engine.backend import TorchBackend

        b = TorchBackend(spec, LoadOptions(n_ctx=1024, n_batch=256, max_num_seqs=4, device="cpu"))
    else:
        from backends.llama_cpp.backend import LlamaCppBackend

        b = LlamaCppBackend(spec, LoadOptions(n_ctx=1024, n_threads=2))
    b.load()
    yield b
    b.close()


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0, max_tokens=160), SamplingParams(temperature=0.9, seed=7, max_tokens=160)],
    ids=["greedy", "sampled"],
)
def test_the_reply_validates_against_the_schema(backend, sampling: SamplingParams) -> None:
    c = backend.generate(
        Request(prompt=PROMPT, sampling=sampling, constraint=Constraint("json_schema", json.dumps(SCHEMA)))
    )
    assert c.finish_reason is FinishReason.STOP, (c.text, c.error)
    jsonschema.validate(json.loads(c.text), SCHEMA)


def test_prefix_json_object_suffix(backend) -> None:
    c = backend.generate(
        Request(
            prompt=PROMPT,
            sampling=SamplingParams(temperature=0, max_tokens=160),
            constraint=Constraint("json_schema", json.dumps(SCHEMA), prefix="<tool_call>\n", suffix="\n</tool_call>"),
        )
    )
    assert c.finish_reason is FinishReason.STOP, (c.text, c.error)
    assert c.text.startswith("<tool_call>\n") and c.text.endswith("\n</tool_call>")
    jsonschema.validate(json.loads(c.text[len("<tool_call>\n") : -len("\n</tool_call>")]), SCHEMA)


def test_a_cut_ends_with_length(backend) -> None:
    c = backend.generate(
        Request(
            prompt=PROMPT,
            sampling=SamplingParams(temperature=0, max_tokens=5),
            constraint=Constraint("json_schema", json.dumps(SCHEMA)),
        )
    )
    assert c.finish_reason is FinishReason.LENGTH and c.stats.completion_tokens == 5
    assert c.text.startswith('{"')
