"""Experts in host RAM, the most-used cached on the device: a named transform on a loaded MoE model.

`offload_experts(model, n_layers, device, num_slots)` takes the routed experts of the first n_layers MoE layers
off the device (the loader keeps them on the host from the start: moe_loader's cpu_expert_layers) and gives
each of those layers an ExpertOffload: its experts stay in (pinned, on CUDA) host memory, and a device cache of
num_slots experts per layer serves the steps.  Which experts are cached is expert_cache.ExpertCachePolicy's
decision, fed by the routing statistics of every step.  Attention, norms, router, shared experts and the KV
cache stay on the device, as with llama.cpp's expert placement (hwprobe.experts).

A step through an offloaded layer: route (on the device) -> the distinct experts routed to (one small read
back to the host) -> the policy's rounds -> per round, copy the missing experts into their slots and run the
grouped experts (KernelSet.moe_experts) on the cache with the step's pairs mapped to slots (pairs of other
rounds weigh 0) -> sum of the rounds.  Decode needs at most top_k x batch experts, so one round once the cache
is warm; a long prompt may take several.  On the CPU the "device" cache is a second set of tensors, which is
how the tests check it (the same logits as the model without offload).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from backends.errors import ConfigError
from backends.torch_engine.expert_cache import ExpertCachePolicy


def default_slots(n_experts: int, top_k: int) -> int:
    """Device cache slots per offloaded layer: twice the experts one token uses (Mixtral: 4 of 8; Qwen3-30B-A3B:
    16 of 128), so one decode step's experts fit with room for the next step's."""
    return max(1, min(n_experts, 2 * top_k))


class ExpertOffload:
    """One MoE layer's experts in host memory with a device cache of num_slots of them."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, device: torch.device, num_slots: int) -> None:
        n_experts = gate_up.shape[0]
        pin = device.type == "cuda"
        self.host_gate_up = gate_up.to("cpu").pin_memory() if pin else gate_up.to("cpu", copy=True)
        self.host_down = down.to("cpu").pin_memory() if pin else down.to("cpu", copy=True)
        self.cache_gate_up = torch.empty((num_slots, *gate_up.shape[1:]), dtype=gate_up.dtype, device=device)
        self.cache_down = torch.empty((num_slots, *down.shape[1:]), dtype=down.dtype, device=device)
        self.policy = ExpertCachePolicy(n_experts, num_slots)
        self.copied_bytes = 0

    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.host_gate_up, self.host_down))

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.cache_gate_up, self.cache_down))

    def run(
        self, moe_experts: Callable[..., torch.Tensor], x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """The routed experts' output for x (num_tokens, hidden) with (num_tokens, k) weights and expert ids,
        through the cache; moe_experts is the KernelSet's op."""
        flat = ids.reshape(-1)
        counts = torch.zeros(self.policy.num_experts, dtype=torch.int64, device=ids.device)
        counts.index_add_(0, flat, torch.ones_like(flat))
        counts_host = counts.tolist()
        self.policy.record(counts_host)
        needed = [e for e, c in enumerate(counts_host) if c]
        out: torch.Tensor | None = None
        for rnd in self.policy.assign(needed):
            for e, s in rnd.copies:
                self.cache_gate_up[s].copy_(self.host_gate_up[e], non_blocking=True)
                self.cache_down[s].copy_(self.host_down[e], non_blocking=True)
                self.copied_bytes += (
                    self.host_gate_up[e].numel() * self.host_gate_up.element_size()
                    + self.host_down[e].numel() * self.host_down.element_size()
                )
            table = torch.full((self.policy.num_experts,), -1, dtype=torch.int64)
            for e, s in rnd.slot_of.items():
                table[e] = s
            slots = table.to(ids.device)[ids]  # (num_tokens, k): -1 for pairs of other rounds
            mine = slots >= 0
            part = moe_experts(
                x, self.cache_gate_up, self.cache_down, torch.where(mine, weights, 0.0), slots.clamp(min=0)
            )
            out = part if out is None else out + part
        assert out is not None  # the policy returns at least one round
        return out


def offload_experts(model, n_layers: int, device: torch.device, num_slots: int) -> list[ExpertOffload]:
    """Give the first n_layers MoE layers of `model` (models/moe.py MoEModel) an ExpertOffload each; their
    expert parameters are dropped from the module (the offload holds them).  Returns the offloads."""
    if n_layers > len(model.moe_layers()):
        raise ConfigError(f"cpu_expert_layers {n_layers} is more than the model's {len(model.moe_layers())} layers")
    offloads = []
    for moe in model.moe_layers()[:n_layers]:
        off = ExpertOffload(moe.gate_up_exps.data, moe.down_exps.data, device, num_slots)
        moe.gate_up_exps = nn.Parameter(torch.empty(0, device=device), requires_grad=False)
        moe.down_exps = nn.Parameter(torch.empty(0, device=device), requires_grad=False)
        moe.offload = off
        offloads.append(off)
    return offloads


def describe_offloads(model) -> dict[str, object]:
    """For ModelRunner.describe(): layers with host experts, their bytes on each side, the cache's hit rate."""
    offs = [moe.offload for moe in model.moe_layers() if moe.offload is not None]
    hits = sum(o.policy.stats.hits for o in offs)
    total = hits + sum(o.policy.stats.misses for o in offs)
    return {
        "cpu_expert_layers": len(offs),
        "expert_host_bytes": sum(o.host_bytes for o in offs),
        "expert_cache_bytes": sum(o.device_bytes for o in offs),
        "expert_cache_slots": offs[0].policy.num_slots if offs else 0,
        "expert_cache_hit_rate": round(hits / total, 3) if total else 0.0,
        "expert_copied_bytes": sum(o.copied_bytes for o in offs),
    }
