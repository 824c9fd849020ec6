"""Scheduler with fake model outputs (no torch): chunked prefill, decode-first, FCFS, preemption, abort."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch_engine_fakes import FakePagedKV, fake_step, reference_continuation

from backends.api import SamplingParams
from backends.errors import ContextOverflowError
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.scheduler import Scheduler


def make(num_blocks: int = 64, max_num_seqs: int = 16, budget: int = 64, max_len: int = 4096):
    bm = BlockManager(num_blocks)
    return bm, Scheduler(bm, max_num_seqs, budget, max_len), FakePagedKV(num_blocks)


def req(rid: str, prompt: list[int], max_tokens: int = 8, eos: frozenset[int] = frozenset()) -> EngineRequest:
    return EngineRequest(rid, tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens), eos)


def run_all(s: Scheduler, kv: FakePagedKV, bm: BlockManager, limit: int = 10_000) -> int:
    steps = 0
    while s.has_unfinished:
        fake_step(s, kv)
        bm.check_invariants(s.running)
        steps += 1
        assert steps < limit
    bm.check_invariants([])
    return steps


def test_status_order_encodes_finished() -> None:
    assert not RequestStatus.PREEMPTED.is_finished
    assert all(s.is_finished for s in RequestStatus if s > RequestStatus.PREEMPTED)


def test_long_prompt_is_chunked_and_running_decodes_go_first() -> None:
    bm, s, kv = make(budget=32)
    a = req("a", [1, 2, 3], max_tokens=50)
    s.add_request(a)
    fake_step(s, kv)  # a's prefill
    s.add_request(req("long", list(range(100))))
    out, _ = fake_step(s, kv)
    assert [x.request_id for x in out.scheduled] == ["a", "long"]
    assert out.num_scheduled_tokens == {"a": 1, "long": 31}  # budget 32: the decode first, then a chunk
    assert not out.scheduled[1].needs_logits
    assert out.scheduled[0].is_decode and not out.scheduled[1].is_decode  # the runner's kernel choice
    for _ in range(3):
        out, _ = fake_step(s, kv)
        assert out.num_scheduled_tokens["a"] == 1  # a keeps streaming while the prompt is prefilled
    assert out.scheduled[1].needs_logits  # 31 + 3 * 31 >= 100: the last chunk samples a token


def test_a_one_token_prompt_remainder_is_not_a_decode() -> None:
    """A 17-token prompt in chunks of 16 leaves one prompt token: it runs as a prompt row, not a decode."""
    bm, s, kv = make(budget=16)
    s.add_request(req("p", list(range(1, 18))))
    first, _ = fake_step(s, kv)
    second, _ = fake_step(s, kv)
    third, _ = fake_step(s, kv)
    assert first.scheduled[0].num_tokens == 16 and not first.scheduled[0].is_decode
    assert second.scheduled[0].num_tokens == 1 and not second.scheduled[0].is_decode
    assert third.scheduled[0].is_decode  # the first sampled token


def test_fcfs_and_max_num_seqs() -> None:
    bm, s, kv = make(max_num_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", [i + 1] * 5, max_tokens=3))
    out, _ = fake_step(s, kv)
    assert [x.request_id for x in out.scheduled] == ["r0", "r1"]
    run_all(s, kv, bm)


def test_outputs_equal_the_reference_and_eos_stops() -> None:
    bm, s, kv = make()
    prompts = [[5, 6, 7], list(range(40)), [9] * 17]
    ref = [reference_continuation(p, 12) for p in prompts]
    eos = frozenset({ref[0][3]})
    rs = [req(f"r{i}", p, max_tokens=12, eos=eos) for i, p in enumerate(prompts)]
    for r in rs:
        s.add_request(r)
    run_all(s, kv, bm)
    for r, p in zip(rs, prompts):
        assert r.output_token_ids == reference_continuation(p, 12, eos)
    assert rs[0].status is RequestStatus.FINISHED_STOPPED and rs[0].num_output_tokens == 4


def test_prompt_longer_than_context_is_refused_at_add_time() -> None:
    bm, s, kv = make(max_len=64)
    with pytest.raises(ContextOverflowError, match="64"):
        s.add_request(req("x", list(range(64))))
    assert not s.has_unfinished and bm.num_free_blocks == 64


def test_context_full_ends_with_length() -> None:
    bm, s, kv = make(max_len=20)
    r = req("r", list(range(15)), max_tokens=100)
    s.add_request(r)
    run_all(s, kv, bm)
    assert r.status is RequestStatus.FINISHED_LENGTH and r.num_tokens == 20


def test_pool_smaller_than_context_caps_the_sequence_length() -> None:
    bm, s, kv = make(num_blocks=2, max_len=4096)
    assert s.max_model_len == 32
    r = req("r", [1] * 20, max_tokens=100)
    s.add_request(r)
    run_all(s, kv, bm)
    assert r.num_tokens == 32 and r.status is RequestStatus.FINISHED_LENGTH


def test_pool_exhaustion_preempts_the_latest_and_recomputes_it_identically() -> None:
    bm, s, kv = make(num_blocks=6, budget=256)
    rs = [req(f"r{i}", [i + 1] * 14, max_tokens=30) for i in range(3)]
    for r in rs:
        s.add_request(r)
    run_all(s, kv, bm)
    assert s.num_preemptions > 0
    assert rs[-1].num_preemptions > 0 and rs[0].num_preemptions == 0  # the oldest is never the victim here
    for r in rs:
        assert r.output_token_ids == reference_continuation(r.prompt_token_ids, 30)


def test_preemption_gives_its_blocks_back() -> None:
    bm, s, kv = make(num_blocks=4, budget=256)
    a, b = req("a", [1] * 16, max_tokens=40), req("b", [2] * 16, max_tokens=40)
    s.add_request(a)
    s.add_request(b)
    preempted = None
    for _ in range(40):
        out, _ = fake_step(s, kv)
        if out.preempted_ids:
            preempted = out
            break
    assert preempted is not None and preempted.preempted_ids == ("b",)
    assert b.block_ids == [] and b.status is RequestStatus.PREEMPTED and s.waiting[0] is b
    assert [x.request_id for x in preempted.scheduled] == ["a"]
    bm.check_invariants(s.running)


def test_abort_at_any_point_returns_blocks() -> None:
    for abort_after in range(6):
        bm, s, kv = make(budget=16)
        rs = [req(f"r{i}", list(range(i, i + 30)), max_tokens=5) for i in range(3)]
        for r in rs:
            s.add_request(r)
        for _ in range(abort_after):
            fake_step(s, kv)
        s.finish_request("r1", RequestStatus.FINISHED_ABORTED)
        s.finish_request("r1", RequestStatus.FINISHED_ABORTED)  # twice, or after it finished: ignored
        assert rs[1].block_ids == [] and rs[1].status is RequestStatus.FINISHED_ABORTED
        bm.check_invariants(s.running)
        run_all(s, kv, bm)
        assert rs[0].output_token_ids == reference_continuation(rs[0].prompt_token_ids, 5)


def test_finished_ids_reach_the_runner_in_the_next_step() -> None:
    bm, s, kv = make()
    s.add_request(req("a", [1, 2], max_tokens=1))
    s.add_request(req("b", [3, 4], max_tokens=5))
    fake_step(s, kv)
    out, _ = fake_step(s, kv)
    assert out.finished_ids == ("a",)


def test_prefix_hit_is_reported_and_skips_the_shared_blocks() -> None:
    bm, s, kv = make()
    system = list(range(48))
    a = req("a", system + [1, 2], max_tokens=3)
    s.add_request(a)
    run_all(s, kv, bm)
    b = req("b", system + [3, 4, 5], max_tokens=3)
    s.add_request(b)
    out, _ = fake_step(s, kv)
    assert out.scheduled[0].start_position == 48 and out.scheduled[0].num_tokens == 3
    assert b.num_cached_tokens == 48
    run_all(s, kv, bm)
    assert b.output_token_ids == reference_continuation(b.prompt_token_ids, 3)


def test_core_modules_do_not_import_torch() -> None:
    code = (
        "import sys, backends.torch_engine.scheduler, backends.torch_engine.block_manager, "
        "backends.torch_engine.request, backends.torch_engine.seams; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
