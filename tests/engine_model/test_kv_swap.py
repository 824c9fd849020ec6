"""Swap space's copies (backends/torch_engine/kv_swap.py) between two CPU pools: the "device" side is a KVPool
like the engine's (head-major on the CPU), the host side a HostKVStore unpinned.  Blocks copied out and back
into other blocks hold exactly the same bits, in every layer, K and V."""

from __future__ import annotations

import torch

from backends.torch_engine.kv_pool import KVPool, block_storage
from backends.torch_engine.kv_swap import HostKVStore, KVSwapper, measure_bandwidth


def _pool(num_blocks: int, dtype: torch.dtype) -> KVPool:
    return KVPool(num_blocks, 16, n_layers=3, kv_heads=2, head_dim=8, dtype=dtype, device=torch.device("cpu"))


def test_blocks_swapped_out_and_into_other_blocks_keep_every_bit() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        pool = _pool(9, dtype)
        pool.commit(9)
        g = torch.Generator().manual_seed(1)
        for k, v in pool.caches:
            for cache in (k, v):
                cache.copy_(torch.randn(cache.shape, generator=g).to(dtype))
        before = [(k.clone(), v.clone()) for k, v in pool.caches]
        store = HostKVStore(pool, 5, pin=False)
        assert store.nbytes == 5 * pool.block_bytes  # swap space is counted in the pool's blocks
        swap = KVSwapper(pool, store)
        swap.swap_out([(2, 4), (7, 0), (3, 1)])
        for k, v in pool.caches:  # the device blocks are reused by others meanwhile
            for cache in (k, v):
                block_storage(cache)[[2, 7, 3]] = float("nan")
        swap.swap_in([(4, 8), (0, 2), (1, 5)])
        for (k0, v0), (k, v) in zip(before, pool.caches):
            for old, new in ((k0, k), (v0, v)):
                assert torch.equal(new[8], old[2]) and torch.equal(new[2], old[7]) and torch.equal(new[5], old[3])
        assert swap.num_swapped_out == swap.num_swapped_in == 3


def test_bandwidth_is_measured_and_positive() -> None:
    assert measure_bandwidth(torch.device("cpu"), nbytes=1 << 20) > 0
