"""How tensor-parallel ranks share heads, FFN rows and vocabulary rows (pure Python)."""

from __future__ import annotations

import pytest

from backends.errors import ConfigError
from backends.torch_engine.tp.partition import balanced, ffn_shards, head_shards


def _covers(spans: list[tuple[int, int]], n: int) -> bool:
    return spans[0][0] == 0 and spans[-1][1] == n and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_the_starter_shares_its_heads_unevenly_at_two_ranks() -> None:
    # SmolLM2-135M: 9 query heads over 3 KV heads (groups of 3): 2 + 1 KV heads, each with its whole group
    a, b = head_shards(9, 3, 2)
    assert (a.q_start, a.q_stop, a.kv_start, a.kv_stop) == (0, 6, 0, 2)
    assert (b.q_start, b.q_stop, b.kv_start, b.kv_stop) == (6, 9, 2, 3)


@pytest.mark.parametrize(
    "n_heads,n_kv,world",
    [(32, 8, 2), (32, 8, 4), (32, 8, 3), (28, 4, 4), (12, 2, 4), (8, 1, 2), (8, 1, 8), (9, 3, 3), (16, 16, 5)],
)
def test_every_query_head_sits_with_its_kv_head(n_heads: int, n_kv: int, world: int) -> None:
    group = n_heads // n_kv
    shards = head_shards(n_heads, n_kv, world)
    assert len(shards) == world
    assert _covers([(s.q_start, s.q_stop) for s in shards], n_heads)
    for s in shards:
        assert s.num_heads >= 1 and s.num_kv_heads >= 1
        local_group = s.num_heads // s.num_kv_heads
        assert s.num_heads == local_group * s.num_kv_heads
        for j in range(s.num_heads):  # the attention kernel maps local head j to local KV head j // local_group
            assert (s.q_start + j) // group == s.kv_start + j // local_group
    if world <= n_kv:  # KV heads split, never replicated
        assert _covers([(s.kv_start, s.kv_stop) for s in shards], n_kv)


def test_heads_that_cannot_be_shared_are_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError, match="3 ranks cannot share 8 query heads and 2 KV heads"):
        head_shards(8, 2, 3)
    with pytest.raises(ConfigError, match="--tensor-parallel"):
        head_shards(4, 1, 8)


def test_balanced_spans_fall_on_units() -> None:
    spans = balanced(49152, 2, 64)
    assert spans == [(0, 24576), (24576, 49152)]
    spans = balanced(1000, 3, 64)
    assert _covers(spans, 1000) and all(a % 64 == 0 for a, _ in spans)
    assert [b - a for a, b in spans] == [384, 320, 296]


def test_ffn_rows_follow_the_quantization_group_or_fall_back_to_rows() -> None:
    assert ffn_shards(1536, 2, 32) == [(0, 768), (768, 1536)]
    assert ffn_shards(96, 4, 64) == balanced(96, 4)  # 64-row units would leave ranks empty: single rows
    with pytest.raises(ConfigError, match="cannot be split over 4 ranks"):
        ffn_shards(3, 4)
