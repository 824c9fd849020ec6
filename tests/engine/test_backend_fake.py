"""TorchBackend's contract with a fake runner: event order, stop strings, EOS, abort, many threads at once."""

from __future__ import annotations

import threading
import time

import pytest
from torch_engine_fakes import EOS, fake_build, fake_spec, reference_continuation

from backends.api import EventKind, FinishReason, LoadOptions, Request, SamplingParams
from backends.errors import ContextOverflowError
from backends.torch_engine.backend import TorchBackend

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture
def backend():
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256, n_batch=32, max_num_seqs=8), build=fake_build(64))
    b.load()
    yield b
    b.close()


def prompt(i: int, n: int = 20) -> tuple[int, ...]:
    return tuple(1 + (i * 7 + j) % 90 for j in range(n))


def test_stream_order_and_greedy_tokens(backend: TorchBackend) -> None:
    p = prompt(1)
    events = list(backend.stream(Request(prompt_token_ids=p, sampling=SamplingParams(max_tokens=10, **GREEDY))))
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.STARTED and kinds[-1] is EventKind.FINISHED
    assert all(k is EventKind.TOKEN for k in kinds[1:-1])
    ids = [t for e in events for t in e.token_ids]
    assert ids == reference_continuation(p, 10)
    last = events[-1]
    assert last.finish_reason is FinishReason.LENGTH
    assert last.stats.prompt_tokens == 20 and last.stats.completion_tokens == 10
    assert 0 < last.stats.ttft_s <= last.stats.total_s
    assert "".join(e.text for e in events) == "".join(f"t{i} " for i in ids if i != EOS)


def test_eos_ends_with_stop_and_is_not_shown(backend: TorchBackend) -> None:
    p = prompt(2)
    ref = reference_continuation(p, 200)
    # Make the 4th generated token an end-of-sequence token for this request.
    spec = fake_spec(eos=(ref[3],))
    b = TorchBackend(spec, LoadOptions(n_ctx=256), build=fake_build(32))
    with b:
        c = b.generate(Request(prompt_token_ids=p, sampling=SamplingParams(temperature=0, max_tokens=50)))
    assert c.finish_reason is FinishReason.STOP
    assert list(c.token_ids) == ref[:3] and c.stats.completion_tokens == 4
    assert c.text == "".join(f"t{i} " for i in ref[:3])


def test_stop_string_split_across_tokens_is_never_shown(backend: TorchBackend) -> None:
    p = prompt(3)
    ref = reference_continuation(p, 12)
    stop = f"{ref[5]} t{ref[6]}"  # starts inside token 6's text, ends inside token 7's
    c = backend.generate(Request(prompt_token_ids=p, sampling=SamplingParams(max_tokens=12, stop=(stop,), **GREEDY)))
    assert c.finish_reason is FinishReason.STOP
    assert stop not in c.text
    assert c.text == "".join(f"t{i} " for i in ref[:5]) + "t"


def test_prompt_longer_than_context_raises_before_started(backend: TorchBackend) -> None:
    with pytest.raises(ContextOverflowError, match="256"):
        backend.stream(Request(prompt_token_ids=tuple(1 + i % 90 for i in range(300))))


def test_context_full_ends_with_length(backend: TorchBackend) -> None:
    c = backend.generate(Request(prompt_token_ids=prompt(4, 250), sampling=SamplingParams(max_tokens=100, **GREEDY)))
    assert c.finish_reason is FinishReason.LENGTH and c.stats.completion_tokens == 6


def test_abort_mid_stream_keeps_text_and_frees_blocks() -> None:
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64, delay_s=0.002))
    with b:
        r = Request(prompt_token_ids=prompt(5), sampling=SamplingParams(max_tokens=500, **GREEDY))
        events = []
        for e in b.stream(r):
            events.append(e)
            if len(events) == 4:
                b.abort(r.request_id)
        assert events[-1].finish_reason is FinishReason.ABORT
        assert 3 <= events[-1].stats.completion_tokens < 500
        b.abort(r.request_id)  # finished: ignored
        b.abort("nobody")
        assert _wait_free(b)


def test_closing_the_generator_aborts_the_request() -> None:
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64, delay_s=0.002))
    with b:
        it = b.stream(Request(prompt_token_ids=prompt(6), sampling=SamplingParams(max_tokens=500, **GREEDY)))
        next(it), next(it)
        it.close()
        assert _wait_free(b)


def _wait_free(b: TorchBackend) -> bool:
    for _ in range(200):
        d = b.describe()
        if d["kv_blocks_free"] == d["kv_blocks"]:
            return True
        time.sleep(0.01)
    return False


def test_many_threads_at_once_each_get_their_own_tokens() -> None:
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256, n_batch=48, max_num_seqs=6), build=fake_build(20))
    results: dict[int, list] = {}
    with b:

        def worker(i: int) -> None:
            p = prompt(i, 10 + i)
            results[i] = [
                p,
                list(b.stream(Request(prompt_token_ids=p, sampling=SamplingParams(max_tokens=25, **GREEDY)))),
            ]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert _wait_free(b)
        runner = b._parts.runner
    assert len(results) == 12
    for p, events in results.values():
        assert events[0].kind is EventKind.STARTED and events[-1].kind is EventKind.FINISHED
        assert [t for e in events for t in e.token_ids] == reference_continuation(p, 25)
    assert max(len(s.scheduled) for s in runner.steps) > 1  # they really shared steps


def test_prefix_cache_hit_reported_in_stats(backend: TorchBackend) -> None:
    system = prompt(7, 40)
    sp = SamplingParams(max_tokens=4, **GREEDY)
    first = backend.generate(Request(prompt_token_ids=system + (5, 6), sampling=sp))
    second = backend.generate(Request(prompt_token_ids=system + (8, 9), sampling=sp))
    assert first.stats.cached_tokens == 0 and second.stats.cached_tokens == 32
    assert list(second.token_ids) == reference_continuation(system + (8, 9), 4)


def test_seeded_sampling_is_reproducible(backend: TorchBackend) -> None:
    sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42, max_tokens=20, ignore_eos=True)
    a = backend.generate(Request(prompt_token_ids=prompt(8), sampling=sp))
    b = backend.generate(Request(prompt_token_ids=prompt(8), sampling=sp))
    assert a.token_ids == b.token_ids
    assert list(a.token_ids) != reference_continuation(prompt(8), 20)  # it really sampled


def test_runner_failure_ends_streams_with_error_and_the_backend_keeps_working() -> None:
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64))
    with b:
        runner = b._parts.runner
        original = runner.execute
        runner.execute = lambda out: (_ for _ in ()).throw(RuntimeError("boom"))
        c = b.generate(Request(prompt_token_ids=prompt(9), sampling=SamplingParams(max_tokens=5, **GREEDY)))
        assert c.finish_reason is FinishReason.ERROR and "boom" in c.error
        runner.execute = original
        c = b.generate(Request(prompt_token_ids=prompt(9), sampling=SamplingParams(max_tokens=5, **GREEDY)))
        assert c.finish_reason is FinishReason.LENGTH


def test_close_ends_open_streams_and_is_idempotent() -> None:
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64, delay_s=0.005))
    b.load()
    it = b.stream(Request(prompt_token_ids=prompt(10), sampling=SamplingParams(max_tokens=1000, **GREEDY)))
    next(it)
    b.close()
    b.close()
    events = list(it)
    assert events[-1].finish_reason is FinishReason.ABORT


def test_logits_run_on_the_engine_thread_and_check_the_context() -> None:
    import numpy as np
    import torch
    from torch_engine_fakes import FakeRunner, FakeTokenizer

    from backends.torch_engine.backend import EngineParts

    seen_threads = []

    def prompt_logits(ids, block_table):
        assert len(block_table) * 16 >= len(ids)
        seen_threads.append(threading.current_thread().name)
        return torch.arange(len(ids) * 3, dtype=torch.float32).reshape(len(ids), 3)

    def build(spec, options, progress):
        return EngineParts(FakeRunner(16), FakeTokenizer(), 16, prompt_logits=prompt_logits)

    with TorchBackend(fake_spec(), LoadOptions(n_ctx=64), build=build) as b:
        out = b.logits([1, 2, 3, 4])
        assert out.dtype == np.float32 and out.shape == (4, 3) and out[3, 2] == 11
        assert seen_threads == ["hearth-torch-engine"]
        assert b.describe()["kv_blocks_free"] == 16  # the scratch blocks went back
        with pytest.raises(ContextOverflowError):
            b.logits(list(range(65)))


def test_the_engine_thread_loads_the_model_and_load_reraises_its_errors() -> None:
    """Weights are built on the engine thread (torch's OpenMP team is per thread: see TorchBackend.load)."""
    from backends.errors import ModelLoadError

    built_on = []

    def build(spec, options, progress):
        built_on.append(threading.current_thread().name)
        if progress is not None:
            progress(1.0, "built")
        return fake_build(16)(spec, options, progress)

    seen = []
    with TorchBackend(fake_spec(), LoadOptions(n_ctx=64), build=build) as b:
        pass
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=64), build=build)
    b.load(lambda fraction, what: seen.append((fraction, what, threading.current_thread().name)))
    b.close()
    assert built_on == ["hearth-torch-engine"] * 2
    assert seen == [(1.0, "built", "hearth-torch-engine")]

    def broken(spec, options, progress):
        raise ModelLoadError("the weights are corrupt", "download them again")

    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=64), build=broken)
    with pytest.raises(ModelLoadError, match="corrupt"):
        b.load()
    assert not any(t.name == "hearth-torch-engine" for t in threading.enumerate())
    b.close()  # nothing to close: no error


def test_describe_and_memory(backend: TorchBackend) -> None:
    d = backend.describe()
    assert d["backend"] == "torch" and d["kv_blocks"] == 64 and d["device"] == "fake" and d["n_ctx"] == 256
    assert backend.memory_in_use()["rss_bytes"] > 0
    assert backend.tokenize("t5 t6") == [5, 6] and backend.detokenize([5]) == "t5 "


def test_text_prompts_are_tokenized(backend: TorchBackend) -> None:
    c = backend.generate(Request(prompt="t3 t4 t5", sampling=SamplingParams(max_tokens=3, **GREEDY)))
    assert list(c.token_ids) == reference_continuation([3, 4, 5], 3) and c.stats.prompt_tokens == 3


def test_kv_pool_size_follows_the_options() -> None:
    from backends.torch_engine.backend import kv_pool_blocks

    spec = fake_spec()  # 1 layer, 1 KV head, head dim 8: a block is 2 x 8 x 2 bytes x 16 tokens = 512 bytes
    assert kv_pool_blocks(spec, LoadOptions(n_ctx=100, max_num_seqs=4), 2) == 4 * 7
    assert kv_pool_blocks(spec, LoadOptions(kv_cache_bytes=512 * 10 + 5), 2) == 10


def test_a_stream_racing_close_still_finishes() -> None:
    b = TorchBackend(fake_spec(), LoadOptions(n_ctx=256), build=fake_build(64))
    b.load()
    engine = b._engine
    it = None
    with b._cv:  # close() has begun: the engine thread takes no more messages
        b._closing = True
        b._cv.notify_all()
        it = b.stream(Request(prompt_token_ids=prompt(11), sampling=SamplingParams(max_tokens=5, **GREEDY)))
    events = list(it)
    assert [e.kind for e in events] == [EventKind.STARTED, EventKind.FINISHED]
    assert events[-1].finish_reason is FinishReason.ABORT
    b.close()
    assert engine is not None and not engine.has_work
