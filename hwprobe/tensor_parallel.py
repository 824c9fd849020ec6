"""How the torch engine's tensor-parallel ranks share a model's heads, as the planner needs it.

The same rule as backends/torch_engine/tp/partition.py (hwprobe imports nothing from backends): whole GQA groups
per rank, KV heads split as evenly as they go (uneven where they do not divide: 3 KV heads over 2 ranks are
2 + 1), or, with more ranks than KV heads, each KV head replicated on world / n_kv_heads ranks.  Every rank
allocates the same KV blocks for its own KV heads, so the rank with most heads is what a device must hold.
"""

from __future__ import annotations


def tp_ranks_ok(n_heads: int, n_kv_heads: int, world: int) -> bool:
    if world == 1:
        return True
    if n_kv_heads < 1 or n_heads % n_kv_heads or world > n_heads:
        return False
    return world <= n_kv_heads or (world % n_kv_heads == 0 and (n_heads // n_kv_heads) % (world // n_kv_heads) == 0)


def tp_kv_heads(n_heads: int, n_kv_heads: int, world: int) -> list[int]:
    """KV heads each rank holds (tp_ranks_ok must hold)."""
    if world <= n_kv_heads:
        base, extra = divmod(n_kv_heads, world)
        return [base + (r < extra) for r in range(world)]
    return [1] * world


def tp_kv_fraction(n_heads: int, n_kv_heads: int, world: int) -> float:
    """The busiest rank's share of the KV cache (what each device's pool is sized by)."""
    return max(tp_kv_heads(n_heads, n_kv_heads, world)) / n_kv_heads
