"""How the torch engine's tensor-parallel ranks share a model's heads, as the planner needs it.

The same rule as backends/torch_engine/tp/partition.py (hwprobe imports nothing from backends): whole GQA groups
per rank, KV heads split as evenly as they go (uneven where they do not divide: 3 KV heads over 2 ranks are
2 + 1), or, with more ranks than KV heads, each KV head replicated on world / n_kv_heads ranks.  Every rank
allocates the same KV blocks for its own KV heads, so the rank with most heads is what a device must hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwprobe import memory as m
from hwprobe.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from hwprobe.report import HardwareReport
    from hwprobe.shape import ModelShape

# The torch engine's weight formats by quality, best first (equal ranks: equal quality); llama.cpp's quants
# where they compare (anything else of the ladder ranks below all of these); W4A16+attn8 (attention W8A16, MLP
# W4A16) between FP8 and W4A16
TORCH_QUALITY = {"bf16": 0, "fp16": 0, "GGUF": 1, "W8A16": 2, "FP8": 3, "W4A16+attn8": 3.5, "W4A16": 4}
LLAMA_CPP_QUALITY = {"F16": 0, "BF16": 0, "Q8_0": 2}


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


def shape_tp_ok(shape: ModelShape, world: int) -> bool:
    """tp_ranks_ok for a model; experts are not split yet (backends/torch_engine/tp refuses them)."""
    if world > 1 and shape.n_experts:
        return False
    return tp_ranks_ok(shape.n_heads, shape.n_kv_heads, world)


def tp_race_reason(gpus: tuple[int, ...], quant: str, tps: float, alt: tuple[str, str] | None, alt_tps: float) -> str:
    """The sentence a tensor-parallel plan gives: its estimate, and what llama.cpp's split (alt: its split mode
    and quant, None when none fits) would have run."""
    out = (
        f"tensor parallel: the torch engine in {len(gpus)} ranks, one per GPU ({', '.join(map(str, gpus))}), "
        f"each holding a share of every layer, {quant} at ~{tps:.0f} tokens/s"
    )
    if alt is None:
        return out + "; llama.cpp fits no quant of the ladder on these GPUs"
    split, alt_quant = alt
    why = (
        "better weights first"
        if TORCH_QUALITY.get(quant, 9) < LLAMA_CPP_QUALITY.get(alt_quant, 5)
        else "the same precision: the torch engine comes first, for its continuous batching"
    )
    return f"{out}; llama.cpp's {split} split would run {alt_quant} at ~{alt_tps:.0f} tokens/s ({why})"


def no_tp_error(report: HardwareReport, shape: ModelShape, n: int) -> PlanError:
    """Why --tensor-parallel N cannot be planned here, with the numbers."""
    if shape.n_experts:
        return PlanError(
            f"tensor parallelism does not split {shape.name}'s {shape.n_experts} experts yet", "drop --tensor-parallel"
        )
    if not shape_tp_ok(shape, n):
        return PlanError(
            f"{n} tensor-parallel ranks cannot share {shape.name}'s {shape.n_heads} query heads and "
            f"{shape.n_kv_heads} KV heads",
            f"use --tensor-parallel {min(shape.n_kv_heads, n)}",
        )
    usable = sum(m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) > 0 for g in report.gpus)
    if usable < n:
        return PlanError(
            f"--tensor-parallel {n} needs {n} GPUs with free memory, this machine has {usable}",
            f"use --tensor-parallel {max(usable, 1)}",
        )
    return PlanError(
        f"{shape.name} fits no torch format on {n} GPUs",
        "drop --tensor-parallel to let the plan choose (llama.cpp's split, or partial offload)",
    )
