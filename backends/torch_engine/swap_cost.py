"""Swap or recompute: which way back is cheaper for a preempted request (pure Python, no torch).

A preempted request comes back either by recomputing its tokens (a prefill of what the prefix cache does not
hold) or, where the engine has swap space (a GPU with pinned host RAM reserved by the plan), by copying the KV
blocks it held alone out to host RAM now and back before it resumes.  The scheduler asks `swap_pays`:

- recompute_s = (computed tokens - tokens in blocks that stay on the device) x per_token_s, the per-token cost
  of a step fitted from the steps that ran (step_cost.StepCostModel; prefill tokens dominate it).  Only the
  blocks the request shares with running requests are counted as staying: the blocks it held alone go back
  to the free list, and under the pressure that preempts they are the next ones handed out, so a recompute
  cannot count on finding them in the prefix cache.
- swap_s = 2 x blocks copied x block_bytes / bytes_per_s: out now and back later, at the host<->device
  bandwidth the runner measured when it set up its host store (kv_swap.measure_bandwidth).

Until the step cost is known (the first steps) swap wins: on every GPU a block copies over PCIe faster than
its 16 tokens prefill through the whole model (Llama 3 8B, bf16: 2 MiB a block, ~0.1 ms at 25 GB/s, against
~1.5 ms of prefill at 10k tokens/s).  On a CPU there is nothing to swap (the KV already is in host RAM) and the
engine has no swap space: a preempted request is always recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SwapCost:
    """What a swap costs on this engine: fixed when the runner sets up its host store."""

    block_bytes: int  # one KV block in every layer, K and V
    bytes_per_s: float  # host<->device copy bandwidth, measured (or injected by tests)

    def swap_s(self, num_blocks: int) -> float:
        """Seconds to copy `num_blocks` blocks out and back."""
        return 2 * num_blocks * self.block_bytes / self.bytes_per_s


def swap_pays(cost: SwapCost, num_swap_blocks: int, num_recompute_tokens: int, per_token_s: float | None) -> bool:
    """Whether swapping `num_swap_blocks` blocks out and back is cheaper than recomputing
    `num_recompute_tokens` tokens at `per_token_s` seconds each (None: not measured yet, swap)."""
    if per_token_s is None:
        return True
    return cost.swap_s(num_swap_blocks) < num_recompute_tokens * per_token_s
