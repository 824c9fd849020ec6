"""The expert cache policy (backends/torch_engine/expert_cache.py, pure Python): hot experts stay, cold ones
go, every needed expert is computed exactly once, and its invariants hold under random routing."""

from __future__ import annotations

import random

import pytest

from backends.torch_engine.expert_cache import ExpertCachePolicy


def _check_invariants(policy: ExpertCachePolicy, rounds, needed) -> None:
    held = [e for e in policy.expert_in if e is not None]
    assert len(held) == len(set(held)), "an expert in two slots"
    seen: list[int] = []
    for r in rounds:
        assert len(r.slot_of) <= policy.num_slots
        assert len(set(r.slot_of.values())) == len(r.slot_of), "two experts of a round in one slot"
        for e, s in r.copies:
            assert r.slot_of[e] == s
        seen += list(r.slot_of)
    assert sorted(seen) == sorted(set(needed)), "every needed expert computed exactly once"


def test_cold_start_copies_then_hits() -> None:
    p = ExpertCachePolicy(num_experts=8, num_slots=4)
    (r,) = p.assign([1, 5])
    assert sorted(e for e, _ in r.copies) == [1, 5]
    (r,) = p.assign([5, 1])
    assert r.copies == () and set(r.slot_of) == {1, 5}
    assert (p.stats.hits, p.stats.misses) == (2, 2) and p.stats.hit_rate == 0.5


def test_the_most_used_experts_stay_cached() -> None:
    p = ExpertCachePolicy(num_experts=8, num_slots=2)
    for _ in range(10):  # expert 3 is hot
        p.record([0, 0, 0, 5, 0, 0, 0, 0])
        p.assign([3])
    p.record([1, 0, 0, 0, 0, 0, 0, 0])
    p.assign([0])  # fills the free slot
    p.record([0, 0, 0, 0, 0, 0, 1, 0])
    (r,) = p.assign([6])  # evicts the colder 0, not the hot 3
    assert r.copies == ((6, p.slot_of(6)),) and p.slot_of(3) is not None and p.slot_of(0) is None


def test_more_experts_than_slots_take_several_rounds() -> None:
    p = ExpertCachePolicy(num_experts=8, num_slots=3)
    needed = [0, 1, 2, 3, 4, 5, 6]
    rounds = p.assign(needed)
    assert len(rounds) == 3
    _check_invariants(p, rounds, needed)


def test_random_routing_keeps_the_invariants() -> None:
    rng = random.Random(0)
    p = ExpertCachePolicy(num_experts=16, num_slots=5)
    for _ in range(300):
        needed = rng.sample(range(16), rng.randint(0, 9))
        counts = [needed.count(e) for e in range(16)]
        p.record(counts)
        _check_invariants(p, p.assign(needed), needed)


def test_a_skewed_workload_mostly_hits() -> None:
    """80 % of tokens go to 4 of 32 experts: a 6-slot cache serves most lookups from the device."""
    rng = random.Random(1)
    p = ExpertCachePolicy(num_experts=32, num_slots=6)
    for _ in range(500):
        e = rng.randrange(4) if rng.random() < 0.8 else rng.randrange(32)
        counts = [0] * 32
        counts[e] = 1
        p.record(counts)
        p.assign([e])
    assert p.stats.hit_rate > 0.7


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="slots"):
        ExpertCachePolicy(num_experts=4, num_slots=5)
    with pytest.raises(ValueError, match="counts"):
        ExpertCachePolicy(num_experts=4, num_slots=2).record([1, 2])
