"""Swap space in the block manager and the scheduler (pure Python, fake paged KV): a preempted request's
blocks go to host slots and come back into fresh device blocks; shared prefix blocks stay; the choice between
swap and recompute follows the cost model; every stream equals its unpreempted run."""

from __future__ import annotations

from torch_engine_fakes import FakePagedKV, fake_step, reference_continuation

from backends.api import SamplingParams
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.request import EngineRequest
from backends.torch_engine.scheduler import Scheduler
from backends.torch_engine.step_cost import StepCostModel
from backends.torch_engine.swap_cost import SwapCost, swap_pays

GREEDY = SamplingParams(temperature=0, max_tokens=20)
FAST = SwapCost(block_bytes=1024, bytes_per_s=1e12)  # a swap costs next to nothing: always chosen
SLOW = SwapCost(block_bytes=1024, bytes_per_s=1.0)  # a swap costs ~2000 s a block: never chosen once measured


def req(rid: str, tokens: list[int], priority: int = 0, at: float = 1000.0) -> EngineRequest:
    return EngineRequest(rid, tuple(tokens), GREEDY, arrival_time=at, priority=priority)


def computed(bm: BlockManager, r: EngineRequest, n: int, cached: list[int] | None = None) -> None:
    assert bm.allocate(r, n, cached or [])
    r.num_computed_tokens += n
    bm.cache_full_blocks(r)


def test_swap_out_moves_exclusive_blocks_to_host_slots_and_keeps_shared_ones() -> None:
    bm = BlockManager(8, num_host_blocks=4)
    a = req("a", list(range(40)))
    computed(bm, a, 40)  # 3 blocks: 2 full, 1 partial
    b = req("b", list(range(32)) + [7, 7, 7])
    hit = bm.find_cached_prefix(b)
    computed(bm, b, 3, hit)  # shares a's two full blocks
    shared, own = b.block_ids[:2], b.block_ids[2]
    copies = bm.swap_out(b)
    assert copies == [(own, 0)]  # its one block alone goes out; the shared two stay held
    assert b.block_ids == shared and b.swap_table == [(False, shared[0]), (False, shared[1]), (True, 0)]
    assert b.num_computed_tokens == 35 and bm.num_free_host_blocks == 3 and bm.num_swapped_out == 1
    bm.check_invariants([a, b])
    back = bm.swap_in(b)
    assert len(back) == 1 and back[0][0] == 0 and b.block_ids[:2] == shared and b.block_ids[2] == back[0][1]
    assert not b.is_swapped_out and bm.num_free_host_blocks == 3  # the slot is free from the next step on
    bm.check_invariants([a, b])
    bm.release_swapped_in()
    assert bm.num_free_host_blocks == 4
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])


def test_a_full_host_store_refuses_the_swap_and_changes_nothing() -> None:
    bm = BlockManager(8, num_host_blocks=2)
    a = req("a", list(range(40)))
    computed(bm, a, 40)
    table = list(a.block_ids)
    assert bm.swap_out_size(a) == 3 and bm.swap_out(a) is None
    assert a.block_ids == table and not a.is_swapped_out and bm.num_free_host_blocks == 2
    bm.check_invariants([a])


def test_freeing_a_swapped_out_request_returns_its_host_slots_and_held_blocks() -> None:
    bm = BlockManager(8, num_host_blocks=4)
    a = req("a", list(range(40)))
    computed(bm, a, 40)
    b = req("b", list(range(32)) + [1])
    computed(bm, b, 1, bm.find_cached_prefix(b))
    bm.swap_out(a)
    bm.swap_out(b)
    bm.check_invariants([a, b])
    bm.free(a)  # an abort while swapped out
    bm.free(b)
    assert bm.num_free_host_blocks == 4 and bm.num_free_blocks == 8
    bm.check_invariants([])


def test_swap_in_needs_room_for_the_host_blocks_and_the_next_tokens() -> None:
    bm = BlockManager(3, num_host_blocks=4)
    a = req("a", list(range(32)))
    computed(bm, a, 32)  # 2 full blocks
    bm.swap_out(a)
    other = req("o", [5] * 17)
    computed(bm, other, 17)  # takes 2 of the 3 device blocks
    assert not bm.can_swap_in(a, 1)  # 2 blocks to bring back, 1 free
    bm.free(other)
    assert bm.can_swap_in(a, 1)  # 2 back + 1 for position 32 = 3
    assert not bm.can_swap_in(a, 17)


def test_swap_pays_compares_the_copy_with_the_recompute() -> None:
    cost = SwapCost(block_bytes=1 << 20, bytes_per_s=1e9)  # 2.1 ms a block out and back
    assert swap_pays(cost, 1, 16, per_token_s=1e-3)  # 16 ms of prefill
    assert not swap_pays(cost, 1, 16, per_token_s=1e-5)  # 0.16 ms
    assert swap_pays(cost, 100, 1, per_token_s=None)  # not measured yet: swap


def _make(num_blocks: int, swap: SwapCost | None, cost: StepCostModel | None = None, host: int = 64):
    bm = BlockManager(num_blocks, num_host_blocks=host)
    s = Scheduler(bm, 2, 40, 4096, aging_s=5.0, cost_model=cost, swap_cost=swap)
    return bm, s, FakePagedKV(num_blocks)


def _run_every_step_preempting(bm: BlockManager, s: Scheduler, kv: FakePagedKV) -> list[EngineRequest]:
    """One step per newcomer that outranks everything running (so every step preempts), in a 3-block pool."""
    rs = [req(f"r{i}", [i + 1] * (7 + i % 9), priority=-i, at=1000.0 + i) for i in range(24)]
    steps = 0
    while s.has_unfinished or steps < len(rs):
        if steps < len(rs):
            s.add_request(rs[steps])
        out, _ = fake_step(s, kv)
        bm.check_invariants([*s.running, *s.waiting])
        if 2 <= steps < len(rs):
            assert out.preempted_ids, f"step {steps} preempted nothing"
        steps += 1
        assert steps < 5000
    for r in rs:
        assert r.output_token_ids == reference_continuation(r.prompt_token_ids, 20), r.request_id
    bm.check_invariants([])
    return rs


def test_every_step_preempts_by_swapping_and_every_stream_equals_its_unpreempted_run() -> None:
    """The fake KV reads every context back through the block tables: a block swapped back wrong, or a host
    slot reused before its copy in ran, gives a wrong context and fails there."""
    bm, s, kv = _make(3, FAST)
    _run_every_step_preempting(bm, s, kv)
    assert s.num_swap_preemptions == s.num_preemptions > 20
    assert bm.num_swapped_out == bm.num_swapped_in > 20
    assert not kv.host  # every slot written was read back


def test_recompute_is_chosen_when_the_copy_costs_more() -> None:
    cost = StepCostModel(min_steps=1)
    for n in (1, 10, 100, 300, 50):
        cost.observe(n, 0.001 + 0.0001 * n)  # measured: 0.1 ms a token
    bm, s, kv = _make(3, SLOW, cost)
    _run_every_step_preempting(bm, s, kv)
    assert s.num_preemptions > 20 and s.num_swap_preemptions == 0 and bm.num_swapped_out == 0


def test_a_full_host_store_falls_back_to_recompute() -> None:
    bm, s, kv = _make(3, FAST, host=1)
    _run_every_step_preempting(bm, s, kv)
    assert 0 < s.num_swap_preemptions < s.num_preemptions


def test_blocks_a_swapped_request_pins_are_given_up_when_nothing_else_makes_room() -> None:
    """b is swapped out holding a prefix it shares with a; a finishes, so b alone pins those blocks.  A lone
    newcomer that needs the whole pool then gets it: b's pins are dropped (it will be recomputed)."""
    bm, s, kv = _make(4, FAST)
    a = req("a", list(range(1, 34)), at=1000.0)  # 33 tokens: 2 full blocks + 1
    s.add_request(a)
    fake_step(s, kv)
    b = req("b", list(range(1, 33)) + [9], priority=-1, at=1001.0)  # shares a's 2 full blocks
    s.add_request(b)
    fake_step(s, kv)
    assert bm.blocks[a.block_ids[0]].ref_count == 2
    s._preempt(b)
    assert b.is_swapped_out and len(b.block_ids) == 2  # the shared two stay held
    s.finish_request("a", a.status.FINISHED_ABORTED)
    big = req("big", [3] * 49, priority=-5, at=1002.0)  # 4 blocks: the whole pool (a 64-token context)
    s.add_request(big)
    out, _ = fake_step(s, kv)
    assert [x.request_id for x in out.scheduled] == ["big"]
    assert not b.is_swapped_out and b.num_computed_tokens == 0  # dropped: recomputed when it comes back
    while s.has_unfinished:
        fake_step(s, kv)
    assert b.output_token_ids == reference_continuation(b.prompt_token_ids, 20)
    assert big.output_token_ids == reference_continuation(big.prompt_token_ids, 64 - 49)  # to the full context
    bm.check_invariants([])
