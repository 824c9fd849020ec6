"""Issue 24 item 1 through the whole engine (fake runner: a row's logits depend on its context alone): a seeded
request gives the same tokens alone and among 15 others with every kind of sampling, and after a preemption."""

from __future__ import annotations

import threading

from torch_engine_fakes import fake_build, fake_spec

from backends.api import LoadOptions, Request, SamplingParams
from backends.torch_engine.backend import TorchBackend

N_TOKENS = 24
KINDS = [
    dict(top_k=0, top_p=1.0, min_p=0.0),  # OpenAI's defaults
    dict(),  # hearth's: top-k 40, top-p 0.95, min-p 0.05
    dict(top_k=0, top_p=0.8, min_p=0.0),
    dict(top_k=7, top_p=1.0, min_p=0.1, repeat_penalty=1.2),
    dict(top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.5, logit_bias={3: 5.0}),
]


def prompt(i: int) -> tuple[int, ...]:
    return tuple(1 + (i * 7 + j) % 90 for j in range(12 + i % 5))


def params(i: int) -> SamplingParams:
    if i % 6 == 5:
        return SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    kind = KINDS[i % len(KINDS)]
    return SamplingParams(temperature=0.7 + 0.1 * (i % 4), seed=1000 + i, max_tokens=N_TOKENS, ignore_eos=True, **kind)


def together(b: TorchBackend, n: int) -> dict[int, tuple[int, ...]]:
    out: dict[int, tuple[int, ...]] = {}
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait(30)
        out[i] = b.generate(Request(prompt_token_ids=prompt(i), sampling=params(i))).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_seeded_requests_give_the_same_tokens_alone_and_in_a_batch_of_16() -> None:
    options = LoadOptions(n_ctx=256, n_batch=512, max_num_seqs=16)
    with TorchBackend(fake_spec(), options, build=fake_build(128, delay_s=0.002)) as b:
        alone = {i: b.generate(Request(prompt_token_ids=prompt(i), sampling=params(i))).token_ids for i in range(16)}
        batched = together(b, 16)
        batches = [len(out.scheduled) for out in b._parts.runner.steps[-N_TOKENS:]]
    assert max(batches) > 8  # they really ran together
    assert batched == alone
    assert len({t for i in range(16) for t in alone[i]}) > 30  # they really sampled


def test_a_preempted_seeded_request_continues_its_own_stream() -> None:
    """A pool too small for 6 sequences: the scheduler preempts and recomputes, and every request still gets
    the tokens it gets alone (its counter did not move while it waited)."""
    options = LoadOptions(n_ctx=64, n_batch=512, max_num_seqs=6)
    with TorchBackend(fake_spec(), options, build=fake_build(9, delay_s=0.001)) as b:
        alone = {i: b.generate(Request(prompt_token_ids=prompt(i), sampling=params(i))).token_ids for i in range(6)}
        batched = together(b, 6)
        preemptions = b._engine.scheduler.num_preemptions
    assert preemptions > 0
    assert batched == alone
