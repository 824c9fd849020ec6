"""16 parallel streaming clients against the torch engine (continuous batching) over HTTP: every reply agrees
with the same request run alone, and the aggregate throughput is printed next to the engine's in-process one.

"Agrees" is tests/greedy_agreement.py's rule, not bit equality: a CPU's bf16 GEMM kernels may round a row
differently alone and among 16 (the Xeon with AMX does), so a reply may part from the reference run (the request
alone on a cold prefix cache) only where that run's top two logits were within NEAR_TIE_ULPS bf16 ulps.
Throughput is reported (-s), not asserted: speed targets live in benchmarks.
"""

from __future__ import annotations

import threading
import time

import pytest

from backends.api import LoadOptions, Request, SamplingParams
from tests.greedy_agreement import assert_greedy_agree, assert_text_agrees, reference_run

pytestmark = [pytest.mark.server, pytest.mark.slow]
pytest.importorskip("backends.torch_engine.model_runner", reason="the torch engine's model half is not there yet")

N_CLIENTS = 16
N_TOKENS = 16
TOPICS = ["the sea", "a cat", "Paris", "rain", "coffee", "a robot", "winter", "the moon"]


@pytest.fixture(scope="module")
def torch_backend(starter_path):
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    b = TorchBackend(load_spec(starter_path), LoadOptions(n_ctx=1024, n_batch=256, max_num_seqs=16, device="cpu"))
    b.load()
    yield b
    b.close()


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Write one sentence about {TOPICS[i % len(TOPICS)]} (#{i})."}]


def ask(client, i: int) -> str:
    stream = client.chat.completions.create(
        model="starter",
        messages=messages(i),
        temperature=0,
        seed=i,
        max_tokens=N_TOKENS,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


def test_16_parallel_streams_equal_alone_and_throughput(live, torch_backend) -> None:
    from openai import OpenAI

    s = live(torch_backend, model_name="starter")
    client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
    alone = [ask(client, i) for i in range(N_CLIENTS)]

    batched: list[str | None] = [None] * N_CLIENTS
    threads = [threading.Thread(target=lambda i=i: batched.__setitem__(i, ask(client, i))) for i in range(N_CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    http_s = time.perf_counter() - t0
    assert all(r is not None for r in batched)
    import httpx

    metrics = httpx.get(s.url + "/metrics").text
    assert "hearth_requests_running 0.0" in metrics and "hearth_queue_depth 0.0" in metrics
    free = float(metrics.split("\nhearth_kv_blocks_free ")[1].split()[0])
    assert free > 0 and "hearth_kv_blocks_used 0.0" in metrics  # every finished stream gave its blocks back

    # The same work in-process: 16 threads on backend.generate, tokens counted by the engine.
    from backends.templates import render_for_spec

    reqs = []
    for i in range(N_CLIENTS):
        r = render_for_spec(torch_backend.spec, messages(i))
        reqs.append(
            Request(
                prompt=r.text,
                add_special=r.add_special,
                sampling=SamplingParams(
                    temperature=0,
                    top_k=0,
                    min_p=0,
                    top_p=1,
                    max_tokens=N_TOKENS,
                    seed=i,
                    stop=tuple(r.stop),
                    ignore_eos=True,
                ),
            )
        )
    done: list = [None] * N_CLIENTS
    threads = [
        threading.Thread(target=lambda i=i: done.__setitem__(i, torch_backend.generate(reqs[i])))
        for i in range(N_CLIENTS)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    direct_s = time.perf_counter() - t0
    tokens = sum(c.stats.completion_tokens for c in done)
    print("\nHTTP batched vs HTTP alone differ for clients", [i for i in range(N_CLIENTS) if batched[i] != alone[i]])
    http_tps, direct_tps = tokens / http_s, tokens / direct_s
    print(
        f"\n{N_CLIENTS} clients x {N_TOKENS} tokens: HTTP {http_tps:.1f} tok/s, in-process {direct_tps:.1f} tok/s "
        f"({100 * http_tps / direct_tps:.0f}%)"
    )
    # Every reply, over HTTP or in-process, alone or among 16, agrees with the reference run.
    token_bytes = torch_backend._parts.tokenizer.token_bytes
    for i, r in enumerate(reqs):
        ids = torch_backend.tokenize(r.prompt, add_special=r.add_special)
        reference, rows = reference_run(torch_backend, ids, N_TOKENS)
        assert_greedy_agree(reference, done[i].token_ids, rows, f"client {i} in-process among 16")
        assert_text_agrees(reference, rows, token_bytes, alone[i], f"client {i} over HTTP alone")
        assert_text_agrees(reference, rows, token_bytes, batched[i], f"client {i} over HTTP among 16")
