"""The torch engine's swap space: host RAM the plan reserves for preempted requests' KV blocks on a GPU.

Plan = allocation: what this prices (Plan.swap_space_bytes, the host's DeviceMemory.swap_mib) is what the engine
pins (LoadOptions.swap_space_bytes -> backends/torch_engine/kv_swap.HostKVStore), in whole KV blocks.

Size: room for every block of the GPU's KV pool (more can never be useful at once for long: each swapped block
was a pool block), capped at TORCH_SWAP_MAX_BYTES (vLLM's default swap space per GPU) and at a quarter of the
host's headroom after everything else the plan puts there (pinned memory cannot be paged out, so it must never
squeeze the rest of the machine).  Zero without a GPU (the pool already is in host RAM: a preempted request is
recomputed or its blocks simply stay), for llama.cpp (no preemption) and for tensor parallelism (not built).
"""

from __future__ import annotations

from dataclasses import replace

from hwprobe import memory as m
from hwprobe.plan_types import DeviceMemory
from hwprobe.shape import ModelShape

TORCH_SWAP_MAX_BYTES = 4 << 30
TORCH_SWAP_HEADROOM_SHARE = 4  # at most 1/4 of host RAM's headroom


def swap_space_bytes(shape: ModelShape, kv_type: str, gpu_pool_bytes: int, host_headroom_bytes: int) -> int:
    """Bytes of swap space, whole blocks: min(the GPU pool, 4 GiB, a quarter of the host's headroom)."""
    block = m.TORCH_KV_BLOCK_TOKENS * m.kv_bytes_per_token(shape, kv_type)
    cap = min(gpu_pool_bytes, TORCH_SWAP_MAX_BYTES, max(host_headroom_bytes, 0) // TORCH_SWAP_HEADROOM_SHARE)
    return cap // block * block


def with_swap_space(
    shape: ModelShape, kv_type: str, gpu_pool_bytes: int, devices: tuple[DeviceMemory, ...]
) -> tuple[tuple[DeviceMemory, ...], int, str | None]:
    """(devices with the host's swap_mib set, swap bytes, the reason to show) for a torch engine on one GPU
    whose pool is `gpu_pool_bytes`; pass 0 for any other plan (no swap space, no reason)."""
    at = next((i for i, d in enumerate(devices) if d.kind == "cpu"), None)
    if gpu_pool_bytes <= 0 or at is None:
        return devices, 0, None
    host = devices[at]
    nbytes = swap_space_bytes(shape, kv_type, gpu_pool_bytes, host.headroom_mib * m.MIB)
    if nbytes == 0:
        return devices, 0, "swap space: none (host RAM has no headroom for it): preempted requests are recomputed"
    devices = devices[:at] + (replace(host, swap_mib=m.mib(nbytes)),) + devices[at + 1 :]
    reason = (
        f"swap space: {m.mib(nbytes)} MiB of pinned host RAM for preempted requests' KV blocks (the GPU pool's "
        f"{m.mib(gpu_pool_bytes)} MiB, capped at {TORCH_SWAP_MAX_BYTES >> 30} GiB and a quarter of host RAM's "
        f"{host.headroom_mib} MiB headroom); a preempted request is swapped out or recomputed, whichever is cheaper "
        "for its length"
    )
    return devices, nbytes, reason
