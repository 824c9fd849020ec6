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
