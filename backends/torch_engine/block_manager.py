"""The paged KV cache's bookkeeping: which physical blocks each request holds (pure Python, no torch).

One pool of `num_blocks` blocks of BLOCK_SIZE tokens.  A request's block table maps its positions to blocks:
block_ids[i] holds positions [i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE).  The tensors live in the model runner;
this module only hands out ids.

Prefix caching: once a FULL block's KV has been computed, it is registered under a chained hash of
(parent block's hash, its token ids), so the hash names the whole prefix up to and including that block.  A new
request whose first blocks hash the same shares them (reference counts) instead of recomputing them.  The
lookup table is keyed by (parent hash, token ids) itself, so two different prefixes can only be confused if
two parent hashes collide on 64 bits; the tokens of every block are compared exactly.

Free blocks sit in one LRU order: blocks that cache nothing are handed out first, then cached blocks from the
least recently freed.  A cached block stays findable while free and is evicted (forgotten) only when handed
out again.

Swap space (`num_host_blocks` > 0; a GPU engine whose plan reserved host RAM for it): a preempted request's
blocks can be swapped out instead of freed.  `swap_out` gives each block the request holds alone a host slot
and frees it on the device (its KV is copied out before the step's forward writes anything; a hashed block
stays findable in the prefix cache meanwhile); blocks shared with other requests stay on the device, still held
by it.  While swapped out, `request.swap_table` lists its table position by position: (False, device block) or
(True, host slot).  `swap_in` takes fresh device blocks for the host slots and rewrites the block table.  The
runner does the copies (backends/torch_engine/kv_swap.py); this module only hands out ids.  A host slot freed by
a swap-in is reused only after `release_swapped_in` (the next step): the step that copies it back may also copy
other blocks out, and those copies run first.

Invariants (checked by `check_invariants`, property-tested): every block is either free (ref_count 0, in the
free list) or used (ref_count > 0, not in the free list); ref_count equals the number of block tables holding
it (a swapped-out request's `block_ids` are its blocks still on the device); every hashed block is in the hash
table under its own key; every host slot is free, held by one swapped-out request, or waiting for release.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from backends.torch_engine.request import EngineRequest
from backends.torch_engine.seams import BLOCK_SIZE

BlockKey = tuple[int | None, tuple[int, ...]]  # (parent block hash or None for the first block, token ids)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0  # block tables that hold this block
    key: BlockKey | None = None  # set while the block is registered in the prefix cache
    block_hash: int | None = None  # hash(key): the hash the next block chains on


def block_key(parent_hash: int | None, token_ids: Sequence[int]) -> BlockKey:
    return (parent_hash, tuple(token_ids))


def chained_hashes(
    token_ids: Sequence[int], block_size: int = BLOCK_SIZE, start: int = 0, parent_hash: int | None = None
) -> list[int]:
    """Hashes of the full blocks of `token_ids` from block index `start` on, chaining on `parent_hash`."""
    hashes: list[int] = []
    for i in range(start, len(token_ids) // block_size):
        parent_hash = hash(block_key(parent_hash, token_ids[i * block_size : (i + 1) * block_size]))
        hashes.append(parent_hash)
    return hashes


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = BLOCK_SIZE,
        enable_prefix_caching: bool = True,
        num_host_blocks: int = 0,
    ) -> None:
        assert num_blocks > 0 and block_size > 0 and num_host_blocks >= 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # front = next out
        self._cached: dict[BlockKey, int] = {}  # key -> block id, for blocks whose KV is computed
        self.num_hit_tokens = 0  # prefix-cache tokens reused, over the manager's life (for stats)
        self.num_evictions = 0
        self.num_host_blocks = num_host_blocks  # swap space in host RAM, in blocks; 0 = never swap
        self._host_free: list[int] = list(range(num_host_blocks - 1, -1, -1))  # a stack: pop() = lowest slot
        self._host_releasing: list[int] = []  # slots swapped in this step, free from the next one
        self.num_swapped_out = 0  # blocks copied to host RAM, over the manager's life (for stats)
        self.num_swapped_in = 0

    # -- queries ------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def num_free_host_blocks(self) -> int:
        return len(self._host_free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, request: EngineRequest) -> list[int]:
        """Block ids of the longest cached prefix of the request's tokens, leaving at least one token to compute
        (the step must end on a token whose logits are sampled)."""
        if not self.enable_prefix_caching:
            return []
        tokens = request.token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        found: list[int] = []
        parent: int | None = None
        for i in range(max_blocks):
            key = block_key(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            block_id = self._cached.get(key)
            if block_id is None:
                break
            found.append(block_id)
            parent = self.blocks[block_id].block_hash
        return found

    def can_allocate(self, request: EngineRequest, num_new_tokens: int, cached_block_ids: Sequence[int] = ()) -> bool:
        """Whether `allocate` would succeed for these new tokens (after taking `cached_block_ids`)."""
        return self._num_blocks_to_take(request, num_new_tokens, cached_block_ids) <= self.num_free_blocks

    def _num_blocks_to_take(self, request: EngineRequest, num_new_tokens: int, cached: Sequence[int]) -> int:
        held = len(request.block_ids) + len(cached)
        need = self.blocks_needed(request.num_computed_tokens + len(cached) * self.block_size + num_new_tokens)
        free_cached = sum(1 for b in cached if self.blocks[b].ref_count == 0)  # taking these uses free slots
        return max(need - held, 0) + free_cached

    # -- changes ------------------------------------------------------------------------------------------
    def allocate(self, request: EngineRequest, num_new_tokens: int, cached_block_ids: Sequence[int] = ()) -> bool:
        """Give the request blocks for `num_new_tokens` more tokens, first adopting `cached_block_ids` (a prefix
        from `find_cached_prefix`, only for a request that holds no blocks yet).  Returns False, changing
        nothing, when the pool cannot provide them."""
        if not self.can_allocate(request, num_new_tokens, cached_block_ids):
            return False
        if cached_block_ids:
            assert not request.block_ids and request.num_computed_tokens == 0
            for block_id in cached_block_ids:
                self._take(block_id)
                request.block_ids.append(block_id)
            request.block_hashes = [self.blocks[b].block_hash for b in cached_block_ids]  # type: ignore[misc]
            request.num_computed_tokens = len(cached_block_ids) * self.block_size
            self.num_hit_tokens += request.num_computed_tokens
        need = self.blocks_needed(request.num_computed_tokens + num_new_tokens)
        while len(request.block_ids) < need:
            block_id = next(iter(self._free))
            self._evict(block_id)
            self._take(block_id)
            request.block_ids.append(block_id)
        return True

    def cache_full_blocks(self, request: EngineRequest) -> None:
        """Register the request's full blocks whose KV is now computed (call after the step ran)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        tokens = request.token_ids
        for i in range(len(request.block_hashes), num_full):
            parent = request.block_hashes[-1] if request.block_hashes else None
            key = block_key(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            block_hash = hash(key)
            request.block_hashes.append(block_hash)
            block = self.blocks[request.block_ids[i]]
            if key in self._cached or block.key is not None:
                continue  # the same prefix is already cached in another block: keep that one
            block.key, block.block_hash = key, block_hash
            self._cached[key] = block.block_id

    def free(self, request: EngineRequest) -> None:
        """Return the request's blocks (and its host slots, if it was swapped out): it starts over.  The tail
        goes back first so that, among equally old blocks, a sequence's end is evicted before its beginning
        (the beginning is the most shareable)."""
        for block_id in reversed(request.block_ids):
            self._release(block_id)
        self._host_free.extend(slot for on_host, slot in request.swap_table if on_host)
        request.block_ids = []
        request.block_hashes = []
        request.swap_table = []
        request.num_computed_tokens = 0

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed more often than taken"
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.key is None:
                self._free.move_to_end(block_id, last=False)  # caches nothing: hand it out first

    # -- swap space ---------------------------------------------------------------------------------------
    def swap_out_size(self, request: EngineRequest) -> int:
        """Blocks `swap_out` would copy to host RAM: those holding computed tokens that the request alone
        holds (shared ones stay on the device)."""
        keep = self.blocks_needed(request.num_computed_tokens)
        return sum(1 for b in request.block_ids[:keep] if self.blocks[b].ref_count == 1)

    def swap_out(self, request: EngineRequest) -> list[tuple[int, int]] | None:
        """Move the request's KV out of the device pool: each block it holds alone (up to its computed tokens)
        gets a host slot and is freed here; shared blocks stay held.  Returns the copies to make, (device block,
        host slot), before the next forward; None, changing nothing, when the host has too few free slots."""
        keep = self.blocks_needed(request.num_computed_tokens)
        if self.swap_out_size(request) > len(self._host_free):
            return None
        for block_id in request.block_ids[keep:]:  # blocks past the computed tokens hold nothing yet
            self._release(block_id)
        copies: list[tuple[int, int]] = []
        table: list[tuple[bool, int]] = []
        held: list[int] = []
        for block_id in request.block_ids[:keep]:
            if self.blocks[block_id].ref_count > 1:
                table.append((False, block_id))
                held.append(block_id)
            else:
                slot = self._host_free.pop()
                copies.append((block_id, slot))
                table.append((True, slot))
                self._release(block_id)
        request.block_ids, request.swap_table = held, table
        self.num_swapped_out += len(copies)
        return copies

    def can_swap_in(self, request: EngineRequest, num_new_tokens: int) -> bool:
        """Whether `swap_in` and then `allocate(request, num_new_tokens)` would both succeed."""
        on_host = sum(1 for on, _ in request.swap_table if on)
        grow = max(self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(request.swap_table), 0)
        return on_host + grow <= self.num_free_blocks

    def swap_in(self, request: EngineRequest) -> list[tuple[int, int]]:
        """Bring a swapped-out request's blocks back: a fresh device block for each host slot, the block table
        rebuilt in order.  Returns the copies to make, (host slot, device block), before the next forward.
        Call only after `can_swap_in`."""
        assert request.swap_table and sum(1 for on, _ in request.swap_table if on) <= self.num_free_blocks
        copies: list[tuple[int, int]] = []
        table: list[int] = []
        for on_host, ident in request.swap_table:
            if not on_host:
                table.append(ident)  # still held
                continue
            block_id = next(iter(self._free))
            self._evict(block_id)
            self._take(block_id)
            copies.append((ident, block_id))
            table.append(block_id)
        self._host_releasing.extend(slot for slot, _ in copies)
        request.block_ids, request.swap_table = table, []
        self.num_swapped_in += len(copies)
        return copies

    def drop_swapped(self, request: EngineRequest) -> None:
        """Give up a swapped-out request's KV (device blocks it still holds and its host slots): it will be
        recomputed.  The scheduler does this when the blocks it pins are needed and nothing else can give."""
        self.free(request)

    def release_swapped_in(self) -> None:
        """The host slots swapped in by the last step are free again (its copies ran)."""
        self._host_free.extend(self._host_releasing)
        self._host_releasing = []

    def trim(self, request: EngineRequest) -> None:
        """Return the blocks past the request's computed tokens (speculative decoding: blocks allocated for
        proposals that were rejected).  They hold no accepted token, so none is hashed (cache_full_blocks only
        registers blocks full of computed tokens) and none is shared."""
        keep = max(self.blocks_needed(request.num_computed_tokens), len(request.block_hashes))
        while len(request.block_ids) > keep:
            block = self.blocks[request.block_ids.pop()]
            assert block.ref_count == 1 and block.key is None, f"block {block.block_id} is shared or cached"
            block.ref_count = 0
            self._free[block.block_id] = None
            self._free.move_to_end(block.block_id, last=False)  # caches nothing: hand it out first

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (e.g. after the weights changed)."""
        for block in self.blocks:
            block.key = block.block_hash = None
        self._cached.clear()

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.key is not None:
            del self._cached[block.key]
            block.key = block.block_hash = None
            self.num_evictions += 1

    # -- checks -------------------------------------------------------------------------------------------
    def check_invariants(self, requests: Sequence[EngineRequest] = ()) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (tests call this after every step).
        `requests`: every request that holds blocks."""
        holders: dict[int, int] = {}
        for r in requests:
            assert len(set(r.block_ids)) == len(r.block_ids), f"{r.request_id} holds a block twice"
            for b in r.block_ids:
                holders[b] = holders.get(b, 0) + 1
        for block in self.blocks:
            free = block.block_id in self._free
            assert free == (block.ref_count == 0), f"block {block.block_id}: free={free}, ref={block.ref_count}"
            if requests or not holders:
                assert holders.get(block.block_id, 0) == block.ref_count, (
                    f"block {block.block_id}: ref_count {block.ref_count}, held by {holders.get(block.block_id, 0)}"
                )
            if block.key is not None:
                assert self._cached.get(block.key) == block.block_id
        assert len(self._cached) == sum(1 for b in self.blocks if b.key is not None)
        slots = [*self._host_free, *self._host_releasing]
        if requests:
            slots += [slot for r in requests for on_host, slot in r.swap_table if on_host]
            assert sorted(slots) == list(range(self.num_host_blocks)), "a host slot is lost or held twice"
        assert len(set(slots)) == len(slots), "a host slot is held twice"
