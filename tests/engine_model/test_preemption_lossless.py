"""Preemption loses nothing, on the real torch engine (a tiny random Llama in float32, CPU): with a KV pool so
small that the streams keep pushing each other out, and priorities that make a newcomer preempt the running
ones, every stream's text and token ids are those of the same request run alone with the same seed.

float32 so that the recompute after a preemption (the prompt path) and the uninterrupted decode (the decode
path) give the same logits to well below any sampling boundary: this test is about the bookkeeping (tokens,
positions, the sampler's seeded state), not about bf16 rounding across kernels (tests/greedy_agreement.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from backends.api import FinishReason, Request, SamplingParams
from tests.tight_pool import open_tight_backend

pytest.importorskip("backends.torch_engine.model_runner", reason="the torch engine's model half is not there yet")

N_TOKENS = 40


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory):
    b = open_tight_backend(Path(tmp_path_factory.mktemp("tiny")))
    yield b
    b.close()


def _request(i: int, priority: int) -> Request:
    sampling = SamplingParams(
        temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, seed=1000 + i, max_tokens=N_TOKENS, ignore_eos=True
    )
    prompt = f"Request {i}: tell me about the number {i * 7}, and then about the sea."
    return Request(prompt=prompt, sampling=sampling, request_id=f"r{i}", priority=priority)


def test_every_stream_equals_its_run_alone_despite_preemptions(backend) -> None:
    requests = [_request(i, priority=-(i % 2)) for i in range(6)]
    alone = {}
    for r in requests:
        c = backend.generate(r)
        assert c.finish_reason is FinishReason.LENGTH and len(c.token_ids) == N_TOKENS
        alone[r.request_id] = c
    before = backend.stats().preemptions

    streamed: dict[str, tuple[str, tuple[int, ...]]] = {}

    def run(r: Request, delay: threading.Event | None) -> None:
        if delay is not None:
            delay.wait(timeout=60)  # the high-priority ones arrive while the others run
        text, ids = [], []
        for event in backend.stream(r):
            text.append(event.text)
            ids.extend(event.token_ids)
        streamed[r.request_id] = ("".join(text), tuple(ids))

    go = threading.Event()
    threads = [
        threading.Thread(target=run, args=(r, go if r.priority < 0 else None), name=r.request_id) for r in requests
    ]
    for t in threads:
        t.start()
    while backend.stats().generated_tokens < 2 * N_TOKENS * len(requests) // 3 + 10:  # well under way
        threading.Event().wait(0.01)
    go.set()
    for t in threads:
        t.join(timeout=300)
    assert backend.stats().preemptions - before >= len(requests)  # the pool forced it, again and again
    for r in requests:
        text, ids = streamed[r.request_id]
        assert ids == alone[r.request_id].token_ids, r.request_id  # no token repeated, missing or changed
        assert text == alone[r.request_id].text, r.request_id
