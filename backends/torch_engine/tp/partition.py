"""Which share of a model each tensor-parallel rank keeps: heads, FFN rows, vocabulary rows.  Pure Python.

Attention heads are split along KV heads so that every rank keeps whole GQA groups (its query heads are exactly
the ones that read its KV heads, and its KV cache holds only those heads).  When the KV heads do not divide by
the rank count they are split unevenly (the starter, 9 query / 3 KV heads at 2 ranks: 6 + 3 query heads,
2 + 1 KV heads); with more ranks than KV heads each KV head is replicated on world / n_kv_heads ranks, which
split its query heads.  Row-parallel splits of quantized weights fall on whole quantization groups (`unit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.errors import ConfigError


@dataclass(frozen=True)
class HeadShard:
    """One rank's attention heads: global index ranges [start, stop)."""

    q_start: int
    q_stop: int
    kv_start: int
    kv_stop: int

    @property
    def num_heads(self) -> int:
        return self.q_stop - self.q_start

    @property
    def num_kv_heads(self) -> int:
        return self.kv_stop - self.kv_start


def balanced(n: int, world: int, unit: int = 1) -> list[tuple[int, int]]:
    """[start, stop) per rank covering range(n), the sizes differing by at most one `unit`, every boundary a
    multiple of `unit` (n itself excepted).  Earlier ranks take the larger shares."""
    units = -(-n // unit)
    base, extra = divmod(units, world)
    out, lo = [], 0
    for r in range(world):
        hi = min(n, lo + (base + (r < extra)) * unit)
        out.append((lo, hi))
        lo = hi
    return out


def head_shards(n_heads: int, n_kv_heads: int, world: int) -> list[HeadShard]:
    """Every rank's HeadShard; ConfigError when `world` ranks cannot share these heads."""
    if world < 1:
        raise ConfigError(f"tensor parallelism needs at least 1 rank, got {world}")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ConfigError(
            f"the model's {n_heads} query heads do not group over its {n_kv_heads} KV heads",
            "run it without --tensor-parallel",
        )
    group = n_heads // n_kv_heads
    if world <= n_kv_heads:
        return [HeadShard(a * group, b * group, a, b) for a, b in balanced(n_kv_heads, world)]
    reps = world // n_kv_heads
    if world % n_kv_heads or group % reps:
        raise ConfigError(
            f"{world} ranks cannot share {n_heads} query heads and {n_kv_heads} KV heads: with more "
            "ranks than KV heads the rank count must be a multiple of the KV heads and divide the "
            f"{group} query heads of each",
            f"use --tensor-parallel {n_kv_heads} or fewer",
        )
    per = group // reps
    return [HeadShard(r * per, (r + 1) * per, r // reps, r // reps + 1) for r in range(world)]


def ffn_shards(ffn_size: int, world: int, unit: int = 1) -> list[tuple[int, int]]:
    """FFN rows per rank: gate_up's output rows and down_proj's input columns, on whole groups of `unit`
    (down_proj's quantization group) where every rank still gets some; else on single rows (the caller then
    keeps down_proj dense)."""
    if ffn_size < world:
        raise ConfigError(f"an FFN of {ffn_size} rows cannot be split over {world} ranks")
    shards = balanced(ffn_size, world, unit)
    if any(hi <= lo for lo, hi in shards):
        return balanced(ffn_size, world)
    return shards
