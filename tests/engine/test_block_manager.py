"""Block manager: allocation, reference counts, prefix caching with chained hashes, LRU eviction."""

from __future__ import annotations

from backends.api import SamplingParams
from backends.torch_engine.block_manager import BlockManager, chained_hashes
from backends.torch_engine.request import EngineRequest

GREEDY = SamplingParams(temperature=0)


def req(rid: str, tokens: list[int]) -> EngineRequest:
    return EngineRequest(rid, tuple(tokens), GREEDY)


def computed(bm: BlockManager, r: EngineRequest, n: int) -> None:
    """Pretend the runner computed the next n tokens."""
    assert bm.allocate(r, n)
    r.num_computed_tokens += n
    bm.cache_full_blocks(r)


def test_allocate_and_free_return_every_block() -> None:
    bm = BlockManager(4)
    r = req("a", list(range(40)))
    assert bm.allocate(r, 40)
    assert len(r.block_ids) == 3 and bm.num_free_blocks == 1
    bm.check_invariants([r])
    bm.free(r)
    assert bm.num_free_blocks == 4 and r.block_ids == []
    bm.check_invariants([])


def test_allocation_that_does_not_fit_changes_nothing() -> None:
    bm = BlockManager(2)
    r = req("a", list(range(40)))
    assert not bm.can_allocate(r, 40)
    assert not bm.allocate(r, 40)
    assert r.block_ids == [] and bm.num_free_blocks == 2


def test_full_blocks_are_found_by_a_second_request_with_the_same_prefix() -> None:
    bm = BlockManager(8)
    a = req("a", list(range(40)))
    computed(bm, a, 40)
    b = req("b", list(range(32)) + [99, 98])
    hit = bm.find_cached_prefix(b)
    assert hit == a.block_ids[:2]  # two full shared blocks; the third block of a is partial, never cached
    assert bm.allocate(b, 2, hit)
    assert b.num_computed_tokens == 32 and b.block_ids[:2] == hit
    assert all(bm.blocks[i].ref_count == 2 for i in hit)
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])


def test_a_hit_never_covers_the_last_token() -> None:
    bm = BlockManager(8)
    a = req("a", list(range(32)))
    computed(bm, a, 32)
    bm.free(a)
    same = req("b", list(range(32)))
    assert len(bm.find_cached_prefix(same)) == 1  # 31 tokens at most: the step must end on a sampled token


def test_chained_hash_depends_on_the_whole_prefix() -> None:
    x = chained_hashes(list(range(32)))
    y = chained_hashes([1000] + list(range(1, 32)))
    assert x[1] != y[1]  # same second block, different first block
    bm = BlockManager(8)
    a = req("a", list(range(33)))
    computed(bm, a, 33)
    b = req("b", [1000] + list(range(1, 33)))
    assert bm.find_cached_prefix(b) == []


def test_free_cached_blocks_stay_findable_until_evicted_least_recent_first() -> None:
    bm = BlockManager(4)
    a = req("a", [1] * 16 + [2] * 16 + [3])
    computed(bm, a, 33)
    bm.free(a)  # two cached blocks and one uncached go back
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    other = req("c", [7] * 17)
    assert bm.allocate(other, 17)  # takes the two blocks that cache nothing first
    assert bm.num_cached_blocks == 2
    assert bm.find_cached_prefix(req("x", [1] * 16 + [2] * 16 + [5])) != []
    more = req("d", [8] * 16)
    assert bm.allocate(more, 16)  # must evict one cached block: the tail (block "2") goes before the head
    assert bm.num_evictions == 1
    assert len(bm.find_cached_prefix(req("y", [1] * 16 + [2] * 16 + [5]))) == 1
    bm.check_invariants([other, more])


def test_adopting_free_cached_blocks_counts_against_free_space() -> None:
    bm = BlockManager(3)
    a = req("a", [1] * 32 + [2])
    computed(bm, a, 33)
    bm.free(a)
    b = req("b", [1] * 32 + [3] * 17)  # 2 cached + 2 new blocks needed, the pool has 3
    hit = bm.find_cached_prefix(b)
    assert len(hit) == 2
    assert not bm.can_allocate(b, 17, hit)
    assert bm.can_allocate(b, 16, hit)


def _fresh_high_water(bm: BlockManager, requests: list[EngineRequest]) -> int:
    """Blocks [0, n) that any request ever held: what a CPU pool commits (backends/torch_engine/kv_pool.py)."""
    return 1 + max((b for r in requests for b in r.block_ids), default=-1)


def test_blocks_freed_by_finished_requests_come_back_before_new_ones() -> None:
    """The pool in host RAM is committed as block ids are first reached: the block manager hands out freed
    blocks (that cache nothing) before any block never used, and never-used ones in id order, so what is
    committed follows the most KV held at once."""
    bm = BlockManager(64)
    high = 0
    for turn in range(5):  # one sequence at a time, as `hearth run` and the chat app run them
        r = req(f"r{turn}", [100 * turn + i for i in range(45)])  # 3 blocks, the last one partial
        assert bm.allocate(r, 45)
        high = max(high, _fresh_high_water(bm, [r]))
        bm.free(r)
    assert high == 3  # the same three blocks every turn
    together = [req(f"t{i}", [1000 * i + j for j in range(33)]) for i in range(4)]
    for r in together:
        assert bm.allocate(r, 33)
    assert sorted(b for r in together for b in r.block_ids) == list(range(12))  # 3 reused, then 3.. in order


def test_a_cached_prefix_is_evicted_only_once_every_never_used_block_is_taken() -> None:
    """Growth before eviction: a finished conversation's cached prefix stays while the reservation has room."""
    bm = BlockManager(8)
    a = req("a", list(range(40)))
    computed(bm, a, 40)
    cached = list(a.block_ids[:2])  # its two full blocks
    bm.free(a)
    b = req("b", [500 + i for i in range(80)])  # 5 blocks: the freed partial one, then 4 never used
    assert bm.allocate(b, 80)
    assert not set(cached) & set(b.block_ids) and bm.num_evictions == 0
    c = req("c", [900 + i for i in range(20)])  # 2 blocks: the last never-used one, then an eviction
    assert bm.allocate(c, 20)
    assert bm.num_evictions == 1 and len(set(cached) & set(c.block_ids)) == 1


def test_refusal_at_the_budget_leaves_the_pool_as_it_was() -> None:
    """The reservation is the budget: a request that would need more blocks than are free waits (allocate is
    False and changes nothing) until blocks come back, whatever has been committed so far."""
    bm = BlockManager(6)
    a, b = req("a", list(range(64))), req("b", list(range(100, 148)))
    assert bm.allocate(a, 64) and not bm.allocate(b, 48)  # 4 + 3 blocks > 6
    assert b.block_ids == [] and bm.num_free_blocks == 2
    bm.check_invariants([a])
    bm.free(a)
    assert bm.allocate(b, 48) and _fresh_high_water(bm, [b]) <= 6
