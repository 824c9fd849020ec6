"""Swap space: a host-RAM copy of KV blocks, and the copies between it and the engine's KV pool.

A GPU engine whose plan reserved swap space (Plan.swap_space_bytes -> LoadOptions.swap_space_bytes) keeps a
`HostKVStore` of that many bytes in pinned host RAM, laid out like the pool's blocks (per layer one K and one V
tensor, indexed by host slot first).  The block manager hands out its slots (BlockManager.swap_out / swap_in);
the runner copies the blocks named by SchedulerOutput.swap_out and swap_in before each forward (`KVSwapper`).
Pinned memory lets the copies run at the PCIe link's speed; `non_blocking` copies out are ordered before any
later kernel on the same stream, and the copies in are waited for by the forward that reads them.

On a CPU there is nothing to gain (the pool already is in host RAM) and the engine keeps no store.  The
"device" side is any KVPool, so tests run the same copies between two CPU pools (`pin=False`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from backends.torch_engine.kv_pool import KVPool, block_storage

BANDWIDTH_PROBE_BYTES = 64 << 20  # copied once each way when a GPU engine sets up its store: ~5 ms at 25 GB/s


class HostKVStore:
    """HostKVStore(pool, num_blocks, pin): `num_blocks` host slots shaped like `pool`'s blocks.

    Attributes: caches (per layer (k, v), each (num_blocks, *one block of the pool's memory)), num_blocks,
    pinned, nbytes."""

    def __init__(self, pool: KVPool, num_blocks: int, pin: bool) -> None:
        assert num_blocks > 0
        self.num_blocks, self.pinned = num_blocks, pin

        def like(cache: torch.Tensor) -> torch.Tensor:
            memory = block_storage(cache)  # (pool blocks, ...) in the pool's memory order
            return torch.empty((num_blocks, *memory.shape[1:]), dtype=cache.dtype, device="cpu", pin_memory=pin)

        self.caches = [(like(k), like(v)) for k, v in pool.caches]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.caches for t in pair)


class KVSwapper:
    """Copies blocks between a KV pool (the device side) and a host store."""

    def __init__(self, pool: KVPool, store: HostKVStore) -> None:
        assert len(pool.caches) == len(store.caches)
        self.pool, self.store = pool, store
        self.num_swapped_out = self.num_swapped_in = 0

    def swap_out(self, copies: Sequence[tuple[int, int]]) -> None:
        """(device block, host slot) pairs: device -> host."""
        if not copies:
            return
        device = self.pool.caches[0][0].device
        src = torch.tensor([d for d, _ in copies], dtype=torch.int64, device=device)
        dst = torch.tensor([h for _, h in copies], dtype=torch.int64)
        for pool_pair, host_pair in zip(self.pool.caches, self.store.caches):
            for cache, host in zip(pool_pair, host_pair):
                # index_select gathers on the device, then one transfer per tensor into the host slots
                host.index_copy_(0, dst, block_storage(cache).index_select(0, src).to("cpu"))
        self.num_swapped_out += len(copies)

    def swap_in(self, copies: Sequence[tuple[int, int]]) -> None:
        """(host slot, device block) pairs: host -> device."""
        if not copies:
            return
        device = self.pool.caches[0][0].device
        self.pool.ensure([[d for _, d in copies]])  # a growing pool commits the blocks before they are written
        src = torch.tensor([h for h, _ in copies], dtype=torch.int64)
        dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=device)
        for pool_pair, host_pair in zip(self.pool.caches, self.store.caches):
            for cache, host in zip(pool_pair, host_pair):
                rows = host.index_select(0, src)
                if self.store.pinned:
                    rows = rows.pin_memory()
                block_storage(cache).index_copy_(0, dst, rows.to(device, non_blocking=self.store.pinned))
        self.num_swapped_in += len(copies)


def measure_bandwidth(device: torch.device, nbytes: int = BANDWIDTH_PROBE_BYTES) -> float:
    """Host<->device bytes per second: the slower of one pinned copy each way (after one warm-up copy)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    seconds = []
    for src, dst in ((host, dev), (dev, host), (host, dev), (dev, host)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - t0)
    return nbytes / max(max(seconds[2:]), 1e-9)  # the first two pay one-time costs
