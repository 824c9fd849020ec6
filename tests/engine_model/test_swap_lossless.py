"""Preemption by swapping loses nothing, on the real torch engine (a tiny random Llama in float32, CPU).  The
engine never swaps on a CPU (its KV already is in host RAM), so the swap space is injected: the runner's pool
plays the device and an unpinned HostKVStore the host, and the copy is priced as free so that every preemption
swaps.  With a KV pool so small that the streams keep pushing each other out, every stream's text and token ids
are those of the same request run alone with the same seed, and blocks went out and came back.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from backends.api import FinishReason, Request, SamplingParams
from tests.tight_pool import BLOCK_BYTES, open_tight_backend

pytest.importorskip("backends.torch_engine.model_runner", reason="the torch engine's model half is not there yet")

N_TOKENS = 40
HOST_BLOCKS = 64


def _swapping_build(spec, options, progress):
    from backends.torch_engine.build import build_engine_parts

    parts = build_engine_parts(spec, options, progress)
    parts.runner.enable_swap(HOST_BLOCKS, bytes_per_s=1e18)  # type: ignore[attr-defined]
    return dataclasses.replace(parts, num_host_blocks=HOST_BLOCKS, swap_cost=parts.runner.swap_cost)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory):
    b = open_tight_backend(Path(tmp_path_factory.mktemp("tiny")), build=_swapping_build)
    yield b
    b.close()


def _request(i: int, priority: int) -> Request:
    sampling = SamplingParams(
        temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, seed=2000 + i, max_tokens=N_TOKENS, ignore_eos=True
    )
    prompt = f"Swap {i}: tell me about the number {i * 11}, and then about the hills."
    return Request(prompt=prompt, sampling=sampling, request_id=f"s{i}", priority=priority)


def test_every_stream_equals_its_run_alone_when_preemptions_swap(backend) -> None:
    assert backend.describe()["swap_space_bytes"] == HOST_BLOCKS * BLOCK_BYTES
    requests = [_request(i, priority=-(i % 2)) for i in range(6)]
    alone = {r.request_id: backend.generate(r) for r in requests}
    for c in alone.values():
        assert c.finish_reason is FinishReason.LENGTH and len(c.token_ids) == N_TOKENS
    before = backend.stats()

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
    threads = [threading.Thread(target=run, args=(r, go if r.priority < 0 else None)) for r in requests]
    for t in threads:
        t.start()
    while backend.stats().generated_tokens < before.generated_tokens + 2 * N_TOKENS * len(requests) // 3 + 10:
        threading.Event().wait(0.01)
    go.set()
    for t in threads:
        t.join(timeout=300)
    after = backend.stats()
    assert after.preemptions_swapped - before.preemptions_swapped >= len(requests)  # swapped, again and again
    assert after.swapped_in_blocks - before.swapped_in_blocks > len(requests)
    assert after.swapped_out_blocks >= after.swapped_in_blocks  # a block comes back at most once
    for r in requests:
        text, ids = streamed[r.request_id]
        assert ids == alone[r.request_id].token_ids, r.request_id  # no token repeated, missing or changed
        assert text == alone[r.request_id].text, r.request_id
