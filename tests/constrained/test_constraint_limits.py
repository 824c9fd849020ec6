"""A constrained request whose grammar hits one of llguidance's per-step limits in the middle of its reply ends
alone: FinishReason.ERROR, error_code "constraint_limit" and a message naming the limit, while the other requests
of the batch (free, and constrained within the limits) finish as they would have.

The limit is lowered for these tests (step_max_items 20, from 50,000): with hearth's limits no finite schema we
know of reaches them mid-reply (an endless one is refused before generation: backends/constrained/finite.py),
and the path must hold whichever schema does.  HEAVY's inner object is where the items pile up: `{"a":{"k":`
then a value, a few tokens in, after the compile-time probe (first mask, forced tokens) passed."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from backends.api import Constraint, FinishReason, LoadOptions, Request, SamplingParams
from tests.constrained.tiny import tiny_build, tiny_spec

HEAVY = {"type": "object", "properties": {"a": {"type": "object"}}, "required": ["a"]}
SMALL = {"type": "integer", "minimum": 0, "maximum": 99}
PROMPTS = [(1, 4, 5), (2, 2), (7, 8, 9, 10), (3,)]


@pytest.fixture
def low_limits(monkeypatch):
    import llguidance

    import backends.constrained.compiler as compiler

    monkeypatch.setattr(
        compiler, "_parser_limits", lambda: llguidance.LLParserLimits(step_max_items=20, verbose_errors=False)
    )


def sampling(i: int, max_tokens: int = 40) -> SamplingParams:
    if i % 2:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=i, max_tokens=max_tokens)


def assert_limit(c) -> None:
    assert c.finish_reason is FinishReason.ERROR, (c.text, c.finish_reason)
    assert c.error_code == "constraint_limit", c.error
    assert "step_max_items" in c.error and "at most 20" in c.error and "\n" not in c.error, c.error
    assert c.text.startswith('{"a":{'), c.text  # it stopped inside the reply, not before it


def test_a_limit_mid_reply_ends_that_request_alone_in_a_torch_batch(low_limits) -> None:
    from backends.torch_engine.backend import TorchBackend

    with TorchBackend(tiny_spec(), LoadOptions(n_ctx=256, n_batch=64, max_num_seqs=8), build=tiny_build()) as b:
        free = {
            f"free-{i}": Request(prompt_token_ids=p, sampling=sampling(i, 24), request_id=f"free-{i}")
            for i, p in enumerate(PROMPTS)
        }
        alone = {rid: b.generate(r).token_ids for rid, r in free.items()}
        heavy = Constraint("json_schema", json.dumps(HEAVY))
        small = Constraint("json_schema", json.dumps(SMALL))
        constrained = {
            f"json-{i}": Request(
                prompt_token_ids=p, sampling=sampling(i), request_id=f"json-{i}", constraint=heavy if i < 2 else small
            )
            for i, p in enumerate(PROMPTS)
        }
        # every stream is queued in the engine before any is drained: they share batches whatever the threads do
        streams = {r.request_id: (r, b.stream(r)) for r in [*constrained.values(), *free.values()]}
        results: dict = {}

        def drain(rid: str) -> None:
            text, ids, last = [], [], None
            for e in streams[rid][1]:
                text.append(e.text)
                ids.extend(e.token_ids)
                last = e
            results[rid] = SimpleNamespace(
                text="".join(text),
                token_ids=tuple(ids),
                finish_reason=last.finish_reason,
                error=last.error,
                error_code=last.error_code,
            )

        threads = [threading.Thread(target=drain, args=(rid,)) for rid in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        steps = b._parts.runner.steps
    assert any(len(out.scheduled) >= 4 for out in steps)  # they did run together
    for rid in ("json-0", "json-1"):
        assert_limit(results[rid])
    for rid in ("json-2", "json-3"):
        c = results[rid]
        assert c.finish_reason is FinishReason.STOP and c.error is None, (rid, c.text, c.error)
        assert 0 <= json.loads(c.text) <= 99
    for rid in free:
        assert results[rid].finish_reason is not FinishReason.ERROR, results[rid].error
        assert results[rid].token_ids == alone[rid], rid


@pytest.mark.slow
def test_a_limit_mid_reply_on_llama_cpp_ends_that_request_and_the_next_ones_run(
    low_limits, starter_path: Path, capfd
) -> None:
    from backends.llama_cpp.backend import LlamaCppBackend
    from backends.modelspec import load_spec

    prompt = "<|im_start|>user\nGive me a JSON object.<|im_end|>\n<|im_start|>assistant\n"
    b = LlamaCppBackend(load_spec(starter_path), LoadOptions(n_ctx=512, n_threads=2))
    b.load()
    try:
        greedy = SamplingParams(temperature=0, max_tokens=24)
        capfd.readouterr()
        c = b.generate(Request(prompt=prompt, sampling=greedy, constraint=Constraint("json_schema", json.dumps(HEAVY))))
        assert_limit(c)
        assert "Traceback" not in capfd.readouterr().err  # the mask's failure is raised typed, never printed
        ok = b.generate(
            Request(prompt=prompt, sampling=greedy, constraint=Constraint("json_schema", json.dumps(SMALL)))
        )
        assert ok.finish_reason is FinishReason.STOP and 0 <= json.loads(ok.text) <= 99, (ok.text, ok.error)
        free = b.generate(Request(prompt=prompt, sampling=SamplingParams(temperature=0, max_tokens=8)))
        assert free.finish_reason is FinishReason.LENGTH and free.error is None
    finally:
        b.close()
