"""One request's failure is that request's alone (issue 16, item 2), with a fake runner: a request that fails
while the engine prepares it, samples it, checks it for a stop or while its caller detokenizes it ends with
FinishReason.ERROR and its own message; every other stream in the batch gets exactly the tokens it gets alone.
Bad seeds and token ids are refused at the edge, before anything runs.  The same on the real starter model:
tests/engine/test_real_model.py::test_failing_requests_leave_the_other_streams_alone."""

from __future__ import annotations

import threading

import pytest
import torch
from torch_engine_fakes import FAILURES, bad_sampling, fake_build, fake_spec, inject_failures, reference_continuation

from backends.api import EngineStats, EventKind, FinishReason, LoadOptions, Request, SamplingParams
from backends.errors import InvalidRequestError
from backends.torch_engine.backend import TorchBackend
from backends.torch_engine.sampler import Sampler

N_TOKENS = 12


def prompt(i: int, n: int = 20) -> tuple[int, ...]:
    return tuple(1 + (i * 11 + j) % 90 for j in range(n))


def greedy(n: int = N_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def seeded(seed: int, n: int = N_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=n, ignore_eos=True)


# -- the edge -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, -1, -(2**63), 2**63, 2**64 - 1])
def test_any_64_bit_seed_is_taken(seed: int) -> None:
    assert SamplingParams(seed=seed).seed == seed


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 1.5, "7", True])
def test_a_seed_that_is_not_a_64_bit_integer_is_refused(seed) -> None:
    with pytest.raises(InvalidRequestError, match="seed must be a 64-bit integer"):
        SamplingParams(seed=seed)


def test_signed_and_unsigned_spellings_of_one_seed_sample_alike() -> None:
    logits = torch.zeros(1, 1000)

    def draws(seed: int) -> list[int]:
        s = Sampler()
        p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        return [s.sample(logits, ["r"], [p], [[]])[0] for _ in range(8)]

    assert draws(-1) == draws(2**64 - 1) and draws(-(2**63)) == draws(2**63)
    assert draws(-1) != draws(2**63)


def test_token_ids_outside_the_vocabulary_are_refused_before_anything_runs() -> None:
    with TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64)) as b:
        for bad in (97, -1):
            with pytest.raises(InvalidRequestError, match=f"token id {bad} is outside the vocabulary of 97"):
                b.stream(Request(prompt_token_ids=(1, 2, bad), sampling=greedy()))
        assert b._parts.runner.steps == []  # nothing reached the engine


# -- failures inside the engine, while others run --------------------------------------------------------
BAD = {rid: (bad_sampling(rid, N_TOKENS), message) for rid, message in FAILURES.items()}


def test_failing_requests_end_alone_while_the_batch_goes_on(monkeypatch) -> None:
    # long enough (40 steps of >= 3 ms) to still run when the bad requests arrive
    good = {f"good-{i}": (prompt(i), greedy(40) if i % 2 else seeded(100 + i, 40)) for i in range(6)}
    b = TorchBackend(
        fake_spec(), LoadOptions(n_ctx=256, n_batch=256, max_num_seqs=12), build=fake_build(96, delay_s=0.003)
    )
    with b:
        alone = {rid: b.generate(Request(prompt_token_ids=p, sampling=sp)).token_ids for rid, (p, sp) in good.items()}
        inject_failures(b, monkeypatch)
        results: dict[str, list] = {}
        first_tokens = threading.Barrier(len(good) + 1)

        def run(rid: str, p: tuple[int, ...], sp: SamplingParams) -> None:
            events = []
            for e in b.stream(Request(prompt_token_ids=p, sampling=sp, request_id=rid)):
                events.append(e)
                if len(events) == 2 and rid.startswith("good"):
                    first_tokens.wait(30)  # the bad requests arrive once every good stream is running
            results[rid] = events

        threads = [threading.Thread(target=run, args=(rid, p, sp)) for rid, (p, sp) in good.items()]
        for t in threads:
            t.start()
        first_tokens.wait(30)
        bad_threads = [
            threading.Thread(target=run, args=(rid, prompt(50 + k), sp)) for k, (rid, (sp, _)) in enumerate(BAD.items())
        ]
        for t in bad_threads:
            t.start()
        for t in threads + bad_threads:
            t.join(60)
        steps = b._parts.runner.steps
        for rid in BAD.keys() - {"bad-prepare"}:  # that one never reaches a step
            assert any(
                rid in ids and ids & good.keys() for ids in ({s.request_id for s in out.scheduled} for out in steps)
            ), f"{rid} ran alone"

        for rid in good:
            events = results[rid]
            assert events[-1].finish_reason is FinishReason.LENGTH, (rid, events[-1].error)
            assert tuple(t for e in events for t in e.token_ids) == alone[rid], rid
        for rid, (_, message) in BAD.items():
            last = results[rid][-1]
            assert last.kind is EventKind.FINISHED and last.finish_reason is FinishReason.ERROR, rid
            assert last.error == message
        assert _idle(b)  # every failed request gave its blocks back
        # ... and the backend goes on serving
        monkeypatch.undo()
        again = b.generate(Request(prompt_token_ids=prompt(3), sampling=greedy()))
        assert list(again.token_ids) == reference_continuation(prompt(3), N_TOKENS)


def test_a_failing_batched_forward_is_still_everyones() -> None:
    """The one failure that cannot be one request's: the runner raised for the whole step."""
    with TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64, delay_s=0.003)) as b:
        runner = b._parts.runner
        execute = runner.execute
        calls = []

        def failing(out):
            calls.append(out)
            if len(calls) == 4:
                raise RuntimeError("forward failed")
            return execute(out)

        runner.execute = failing
        done: dict[int, object] = {}
        threads = [
            threading.Thread(
                target=lambda i=i: done.__setitem__(
                    i, b.generate(Request(prompt_token_ids=prompt(i), sampling=greedy()))
                )
            )
            for i in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(c.finish_reason is FinishReason.ERROR and "forward failed" in c.error for c in done.values())
        assert _idle(b)


# -- the published snapshot ------------------------------------------------------------------------------
def test_stats_is_a_snapshot_the_engine_thread_publishes() -> None:
    with TorchBackend(fake_spec(), LoadOptions(n_ctx=256, max_num_seqs=4), build=fake_build(64, delay_s=0.01)) as b:
        st = b.stats()
        assert isinstance(st, EngineStats) and (st.kv_blocks, st.kv_blocks_free, st.kv_block_size) == (64, 64, 16)
        assert st.running == st.waiting == st.generated_tokens == 0 and st.rss_bytes > 0
        it = iter(b.stream(Request(prompt_token_ids=prompt(1, 40), sampling=greedy())))
        next(it), next(it)  # STARTED, first token
        busy = b.stats()
        assert busy.running == 1 and busy.kv_blocks_free < 64 and busy.generated_tokens >= 1
        assert b.stats() is not b.stats()  # a copy per call: nothing a reader holds changes under it
        list(it)
        assert _idle(b)
        st = b.stats()
        assert st.running == 0 and st.generated_tokens == N_TOKENS
        assert st.prefix_cached_blocks == (40 + N_TOKENS - 1) // 16  # full blocks of the computed tokens
        assert b.describe()["kv_blocks_free"] == st.kv_blocks_free  # describe() reads the same snapshot


def _idle(b: TorchBackend) -> bool:
    import time

    for _ in range(300):
        st = b.stats()
        if st.kv_blocks_free == st.kv_blocks and st.running == st.waiting == 0:
            return True
        time.sleep(0.01)
    return False
