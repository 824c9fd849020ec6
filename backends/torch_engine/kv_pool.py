"""The paged KV pool's memory: per layer one K and one V tensor of num_blocks blocks, committed as it is used.

The plan reserves the pool (LoadOptions.kv_cache_bytes: the sequences the command will run, issue 24) and the
block manager hands out its block ids; this module holds the tensors.  On a GPU the pool is allocated whole at
load (CUDA graphs capture its addresses, and a GPU gives no memory back to others anyway).  In host RAM the pool
is reserved, not touched: torch.empty takes address space and no pages, and blocks are committed (zeroed, which
makes their pages resident) in steps of COMMIT_TOKENS the first time a step's block tables reach past what is
committed.  The block manager hands out never-used blocks in id order, and only after the blocks freed by
finished requests (backends/torch_engine/block_manager.py), so what is committed follows the most KV the engine
has held at once, never past the plan's reservation.  `hearth run` on the starter: a 180 MiB reservation for its
8192-token context, of which a short reply commits a few MiB (the whole 2.8 GiB pool of 16 sequences was zeroed
at load before, 3.5 s of system time faulting it in).  Committed blocks stay committed (no shrinking: a later
long reply would fault them in again).

Why zero at all: attention reads whole blocks and masks the positions past a sequence's length; memory that was
never written could hold NaN bit patterns (a heap allocation reusing freed memory), and NaN x 0 is NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from kernels.attention import allocate_kv_cache

COMMIT_TOKENS = 256  # committed at a time in host RAM: 5.6 MiB for the starter, 32 MiB for Llama 3 8B (f16)


class KVPool:
    """KVPool(num_blocks, block_size, n_layers, kv_heads, head_dim, dtype, device): the caches of every layer.

    Attributes: caches (per layer (k_cache, v_cache), each indexed (num_blocks, block_size, kv_heads, head_dim):
    head-major memory on the CPU, kernels.attention.allocate_kv_cache), num_blocks, num_committed (blocks whose
    memory is in use; num_blocks on a GPU)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        n_layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        grows = device.type == "cpu"
        # Head-major memory on CPU (kernels.attention.allocate_kv_cache says why); CUDA keeps the token-major
        # layout the Triton kernels were written and tuned for.

        def cache() -> torch.Tensor:
            return allocate_kv_cache(
                num_blocks, block_size, kv_heads, head_dim, dtype, device, head_major=grows, zeroed=not grows
            )

        self.caches = [(cache(), cache()) for _ in range(n_layers)]
        self.num_committed = 0 if grows else num_blocks
        self._step = max(1, -(-COMMIT_TOKENS // block_size))

    @property
    def block_bytes(self) -> int:
        """Bytes of one block in every layer, K and V."""
        return sum(k[0].numel() * k.element_size() * 2 for k, _ in self.caches)

    @property
    def reserved_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def committed_bytes(self) -> int:
        return self.num_committed * self.block_bytes

    def commit(self, num_blocks: int) -> None:
        """Make blocks [0, num_blocks) usable: zero the ones not committed yet, in steps of COMMIT_TOKENS, up to
        the pool's size."""
        if num_blocks <= self.num_committed:
            return
        end = min(self.num_blocks, -(-num_blocks // self._step) * self._step)
        start = self.num_committed
        for pair in self.caches:
            for cache in pair:
                block_storage(cache)[start:end].zero_()
        self.num_committed = end

    def ensure(self, block_tables: Iterable[Sequence[int]]) -> None:
        """Commit every block these tables name (before a forward writes into them)."""
        if self.num_committed == self.num_blocks:
            return
        top = max((max(t) for t in block_tables if len(t)), default=-1)
        if top >= self.num_committed:
            self.commit(top + 1)

    def close(self) -> None:
        self.caches = []


def block_storage(cache: torch.Tensor) -> torch.Tensor:
    """The cache indexed (block, ...) in a fixed order, for copying and zeroing blocks: the tensor itself
    (token-major), or its head-major memory (kv_heads, num_blocks, ...) with the block first (a strided view)."""
    return cache if cache.is_contiguous() else cache.permute(0, 2, 1, 3)
