"""Paged attention over a block-structured KV cache, for prefill chunks and decodes in one batch.

The cache of one layer is a pool of blocks: k_cache, v_cache of shape (num_blocks, block_size, kv_heads, D).
Sequence s owns the blocks block_tables[s]; its token at position p lives in slot
    block_tables[s][p // block_size] * block_size + p % block_size.
A step runs `q_len[s]` new tokens of each sequence, at positions [context_len[s] - q_len[s], context_len[s]),
after their K/V were written to the cache (`write_kv`).  New token i of sequence s attends to cached positions
j <= context_len[s] - q_len[s] + i: the causal mask is aligned to the lower right, which is what a chunk
sitting on cached prefix tokens needs (SDPA's is_causal=True is aligned to the upper left: wrong here).

Math, per sequence and head h (GQA: kv head h // (num_heads / kv_heads)):
    out_i = softmax_j(scale * q_i . k_j  for allowed j) @ v

Sliding-window layers (Gemma 3, Mistral v0.1) see only the last `window` positions, the query's own included:
j is allowed when q_pos - window < j <= q_pos (llama.cpp's and Hugging Face's rule).  `with_sliding_window`
gives the step's metadata with that narrower mask (and meta.window, which the Triton kernels read: they mask
the positions behind the window and skip its whole blocks); the cache itself keeps every position (no blocks
are freed behind the window: the KV pool is sized as for full attention).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionGroup:
    """Sequences attended together in one SDPA call by the fast path (all with the same q_len)."""

    token_index: torch.Tensor  # (num_seqs * q_len,) int64: rows of the flattened batch, sequence-major
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int64, padded with block 0 (masked out)
    mask: torch.Tensor  # (num_seqs, 1, q_len, max_blocks * block_size) bool, True = may attend
    q_len: int  # new tokens per sequence in this group
    memo: dict[object, torch.Tensor] = field(default_factory=dict)  # per-step tensors the first layer builds
    # a group of one sequence whose blocks are first_block, first_block + 1, ... (one run of the pool, as a
    # growing pool hands them out): a head-major cache reads them in place (head_major_run), no gather; else -1
    first_block: int = -1


@dataclass
class AttentionMetadata:
    """Everything attention needs about one step, built once per step and shared by all layers."""

    slot_mapping: torch.Tensor  # (num_tokens,) int64: cache slot of each new token
    query_start: tuple[int, ...]  # (num_seqs + 1,): sequence s owns rows [query_start[s], query_start[s+1])
    context_lens: tuple[int, ...]  # (num_seqs,): tokens of s in the cache after this step
    block_tables: tuple[tuple[int, ...], ...]  # (num_seqs, blocks of s): the reference path reads these
    groups: tuple[AttentionGroup, ...]  # the fast path's batching of the same sequences
    block_size: int
    memo: dict[object, torch.Tensor] = field(default_factory=dict)  # per-step tensors the first layer builds
    window: int = 0  # sliding window in tokens (0 = full causal attention): see with_sliding_window


def with_sliding_window(meta: AttentionMetadata, window: int) -> AttentionMetadata:
    """`meta` for a layer that attends to the last `window` positions only: the same tables, every group's mask
    narrowed to q_pos - window < j.  Built once per step and window (kept in meta.memo), shared by the layers."""
    key = ("window", window)
    cached = meta.memo.get(key)
    if cached is None:
        groups = []
        for g in meta.groups:
            q_pos = g.mask.sum(dim=-1, keepdim=True) - 1  # the causal mask allows exactly j <= q_pos
            j = torch.arange(g.mask.shape[-1], device=g.mask.device)
            groups.append(dataclasses.replace(g, mask=g.mask & (j > q_pos - window), memo={}))
        cached = meta.memo[key] = dataclasses.replace(meta, groups=tuple(groups), window=window)  # type: ignore[assignment]
    return cached  # type: ignore[return-value]


def build_attention_metadata(
    seqs: list[tuple[int, int, tuple[int, ...]]], block_size: int, device: torch.device | str = "cpu"
) -> AttentionMetadata:
    """seqs: (start_position, q_len, block_table) per sequence, in batch order (rows are flattened in it).

    The fast path batches all single-token sequences (decodes) into one group and gives every longer chunk its
    own group: padding a 512-token prefill chunk and 15 decodes to one shape would waste 15x the work."""
    slots: list[int] = []
    starts = [0]
    ctx_lens = []
    for start, q_len, table in seqs:
        assert len(table) * block_size >= start + q_len, "block table too short for the scheduled tokens"
        for p in range(start, start + q_len):
            slots.append(table[p // block_size] * block_size + p % block_size)
        starts.append(starts[-1] + q_len)
        ctx_lens.append(start + q_len)
    decode_ids = [s for s, (_, q_len, _) in enumerate(seqs) if q_len == 1]
    chunk_ids = [s for s, (_, q_len, _) in enumerate(seqs) if q_len > 1]
    groups = []
    for ids in ([decode_ids] if decode_ids else []) + [[s] for s in chunk_ids]:
        groups.append(_group(ids, seqs, starts, ctx_lens, block_size, device))
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start=tuple(starts),
        context_lens=tuple(ctx_lens),
        block_tables=tuple(tuple(t) for _, _, t in seqs),
        groups=tuple(groups),
        block_size=block_size,
    )


def _group(
    ids: list[int],
    seqs: list[tuple[int, int, tuple[int, ...]]],
    starts: list[int],
    ctx_lens: list[int],
    block_size: int,
    device: torch.device | str,
) -> AttentionGroup:
    q_len = seqs[ids[0]][1]
    max_blocks = max((ctx_lens[s] + block_size - 1) // block_size for s in ids)
    tables = torch.zeros(len(ids), max_blocks, dtype=torch.int64)
    for row, s in enumerate(ids):
        used = seqs[s][2][:max_blocks]
        tables[row, : len(used)] = torch.tensor(used, dtype=torch.int64)
    ctx = torch.tensor([ctx_lens[s] for s in ids])[:, None, None]  # (n, 1, 1)
    i = torch.arange(q_len)[None, :, None]  # query index within the chunk
    j = torch.arange(max_blocks * block_size)[None, None, :]  # key position
    mask = j <= (ctx - q_len + i)  # lower-right causal; also hides padding (j >= ctx)
    token_index = torch.cat([torch.arange(starts[s], starts[s] + q_len) for s in ids])
    first = -1
    if len(ids) == 1:
        used = seqs[ids[0]][2][:max_blocks]
        if used and all(b == used[0] + i for i, b in enumerate(used)):
            first = used[0]
    return AttentionGroup(token_index.to(device), tables.to(device), mask[:, None].to(device), q_len, first_block=first)


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    head_major: bool = False,
    zeroed: bool = True,
) -> torch.Tensor:
    """One layer's K (or V) cache, always indexed (num_blocks, block_size, kv_heads, D).

    zeroed=False: torch.empty, address space without pages on the CPU; the caller zeroes blocks before their
    first use (backends/torch_engine/kv_pool.py commits a CPU pool that way, in steps).

    head_major: the memory holds (kv_heads, num_blocks, block_size, D), each KV head's positions one plane, and
    the tensor is a permuted view of it.  Then one gather of blocks per kv head yields (n, kv_heads, length, D)
    contiguous, which is what the decode matmuls read (the token-major layout needs a transposing copy of every
    gathered K and V per layer on top: on the 2-core CPU ~5 of 37 ms of a batch-16 decode step); and a sequence
    whose blocks are one run of the pool is already (kv_heads, length, D) in place, a strided view that SDPA reads
    without any gather (head_major_run: 44 against 83 us a layer for the starter's one stream, 280 positions).
    Everything here works on either layout."""
    make = torch.zeros if zeroed else torch.empty
    if head_major:
        return make(kv_heads, num_blocks, block_size, head_dim, dtype=dtype, device=device).permute(1, 2, 0, 3)
    return make(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)


def is_head_major(cache: torch.Tensor) -> bool:
    """Whether the memory is (kv_heads, num_blocks, block_size, D).  With one KV head (Gemma 3 270M) both
    layouts are the same memory: a contiguous cache counts as head-major, so the head-major paths (one gather
    per block, the in-place runs, and the scripted decode loop that mirrors them) serve it."""
    return cache.permute(2, 0, 1, 3).is_contiguous()


def _head_major_memory(cache: torch.Tensor) -> torch.Tensor | None:
    """A head-major cache's memory as (kv_heads * num_blocks * block_size, D), else None.  Kept on the tensor
    object: a pool's caches live as long as the runner, and every layer of every step asks (four times a layer
    the permute, view and layout checks were ~10 small ops)."""
    memory = getattr(cache, "_hearth_memory", False)
    if memory is False:
        memory = cache.permute(2, 0, 1, 3).view(-1, cache.shape[-1]) if is_head_major(cache) else None
        cache._hearth_memory = memory
    return memory


def head_major_write_rows(
    slot_mapping: torch.Tensor,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    memo: dict[object, torch.Tensor] | None = None,
) -> torch.Tensor:
    """(num_tokens * kv_heads,) the head-major memory row of each new token's K/V heads, token-major:
    head * (num_blocks * block_size) + slot.  Kept in `memo` (the step's AttentionMetadata.memo): built by the
    first layer, reused by the others (~10 small ops a layer, ~0.5 ms of a 30-layer batch-1 CPU step)."""
    key = ("write_rows", num_blocks, block_size, kv_heads)
    rows = None if memo is None else memo.get(key)
    if rows is None:
        plane = torch.arange(kv_heads, device=slot_mapping.device) * (num_blocks * block_size)
        rows = (slot_mapping[:, None] + plane[None, :]).reshape(-1)
        if memo is not None:
            memo[key] = rows
    return rows


def head_major_gather_rows(g: AttentionGroup, kv_heads: int, num_blocks: int) -> torch.Tensor:
    """(n, kv_heads, max_blocks) the rows head * num_blocks + block of a head-major (kv_heads * num_blocks,
    block, D) memory that hold the group's sequences' blocks, in order; kept in the group's memo (built by the
    first layer)."""
    rows = g.memo.get(("rows", kv_heads, num_blocks))
    if rows is None:
        heads = torch.arange(kv_heads, device=g.block_tables.device) * num_blocks
        rows = g.block_tables[:, None, :] + heads[None, :, None]
        g.memo[("rows", kv_heads, num_blocks)] = rows
    return rows


def head_major_run(memory: torch.Tensor, kv_heads: int, first_block: int, length: int, block_size: int) -> torch.Tensor:
    """(1, kv_heads, length, D): the positions first_block * block_size ... + length of a head-major memory
    (_head_major_memory's), in place: a strided view, no copy (AttentionGroup.first_block)."""
    planes = memory.view(kv_heads, -1, memory.shape[-1])
    return planes.narrow(1, first_block * block_size, length).unsqueeze(0)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    memo: dict[object, torch.Tensor] | None = None,
) -> None:
    """Store the new tokens' K/V: k, v (num_tokens, kv_heads, D) into their slots of the caches.
    memo: the step's AttentionMetadata.memo; a head-major cache's memory rows are computed once per step
    there instead of once per layer (head_major_write_rows)."""
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        kv_heads, head_dim = k_cache.shape[-2:]
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
        return
    k_memory, v_memory = _head_major_memory(k_cache), _head_major_memory(v_cache)
    if k_memory is not None and v_memory is not None:
        nb, bs, kv_heads, head_dim = k_cache.shape
        rows = head_major_write_rows(slot_mapping, nb, bs, kv_heads, memo)
        k_memory.index_copy_(0, rows, k.reshape(-1, head_dim).to(k_memory.dtype))
        v_memory.index_copy_(0, rows, v.reshape(-1, head_dim).to(v_memory.dtype))
        return
    bs = k_cache.shape[1]
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)


def paged_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Slow version: per sequence, gather its positions one slot at a time and do softmax by hand in float32.
    q: (num_tokens, num_heads, D) -> (num_tokens, num_heads, D)."""
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    bs = meta.block_size
    for s, table in enumerate(meta.block_tables):
        lo, hi = meta.query_start[s], meta.query_start[s + 1]
        ctx = meta.context_lens[s]
        blocks = torch.tensor([table[p // bs] for p in range(ctx)], dtype=torch.long, device=q.device)
        offsets = torch.arange(ctx, device=q.device) % bs
        keys = k_cache[blocks, offsets].float()  # (ctx, kv_heads, D), whatever the cache's strides
        vals = v_cache[blocks, offsets].float()
        keys = keys.repeat_interleave(group, dim=1)  # (ctx, num_heads, D)
        vals = vals.repeat_interleave(group, dim=1)
        qs = q[lo:hi].float()  # (q_len, num_heads, D)
        scores = torch.einsum("qhd,khd->hqk", qs, keys) * scale
        q_pos = torch.arange(ctx - (hi - lo), ctx, device=q.device)[:, None]
        k_pos = torch.arange(ctx, device=q.device)[None, :]
        allowed = k_pos <= q_pos  # (q_len, ctx)
        if meta.window:
            allowed &= k_pos > q_pos - meta.window
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, vals).to(q.dtype)
    return out


def paged_attention_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Fast plain-torch path: per group, gather the blocks (k_cache[block_tables]), one masked SDPA call."""
    num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    k_memory, v_memory = _head_major_memory(k_cache), _head_major_memory(v_cache)
    for g in meta.groups:
        n = g.block_tables.shape[0]
        length = g.block_tables.shape[1] * meta.block_size
        if k_memory is not None and v_memory is not None and g.first_block >= 0:
            # head-major, one run of blocks: read in place
            keys = head_major_run(k_memory, kv_heads, g.first_block, length, meta.block_size).to(q.dtype)
            vals = head_major_run(v_memory, kv_heads, g.first_block, length, meta.block_size).to(q.dtype)
        elif k_memory is not None and v_memory is not None:
            # head-major: rows (head, block) of the (kv_heads * num_blocks, block, D) memory, gathered in order
            rows = head_major_gather_rows(g, kv_heads, k_cache.shape[0])
            bs = meta.block_size
            keys = _gather(k_memory.view(-1, bs, head_dim), rows).view(n, kv_heads, length, head_dim).to(q.dtype)
            vals = _gather(v_memory.view(-1, bs, head_dim), rows).view(n, kv_heads, length, head_dim).to(q.dtype)
        else:  # (n, max_blocks, block, kv_heads, D) -> (n, kv_heads, length, D)
            keys = _gather(k_cache, g.block_tables).view(n, length, kv_heads, head_dim).transpose(1, 2).to(q.dtype)
            vals = _gather(v_cache, g.block_tables).view(n, length, kv_heads, head_dim).transpose(1, 2).to(q.dtype)
        if g.q_len == 1:
            rows_q = q if g.token_index.shape[0] == num_tokens else q.index_select(0, g.token_index)
            o = _decode_attention(rows_q, keys, vals, _mask_bias(g), scale)
            if rows_q is q:  # a decode-only step: every row, in order, no scatter
                out = o
            else:
                out.index_copy_(0, g.token_index, o)
            continue
        qs = q.index_select(0, g.token_index).view(n, g.q_len, num_heads, head_dim).transpose(1, 2)  # (n, H, q, D)
        o = torch.nn.functional.scaled_dot_product_attention(
            qs, keys, vals, attn_mask=g.mask, scale=scale, enable_gqa=kv_heads != num_heads
        )
        out.index_copy_(0, g.token_index, o.transpose(1, 2).reshape(n * g.q_len, num_heads, head_dim))
    return out


def _gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for a contiguous table, as one index_select over its first dimension: on CPU 8x faster
    than advanced indexing for KV blocks (21 vs 169 us for 624 blocks of 1024 bf16 values)."""
    flat = table.view(table.shape[0], -1)
    return torch.index_select(flat, 0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def _mask_bias(g: AttentionGroup) -> torch.Tensor:
    """g.mask as an additive float32 bias (0 where it may attend, -inf where not), built once per step."""
    bias = g.memo.get("bias")
    if bias is None:
        bias = torch.zeros(g.mask.shape, dtype=torch.float32, device=g.mask.device)
        bias = g.memo["bias"] = bias.masked_fill_(~g.mask, float("-inf"))
    return bias


def _decode_attention(
    q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """One new token per sequence: q (n, H, D); keys/vals (n, kv_heads, L, D) padded to whole blocks; bias
    (n, 1, 1, L) float32, 0 or -inf (_mask_bias) -> (n, H, D).  One SDPA call with the GQA group folded into
    the query rows (q viewed (n, kv_heads, group, D): no K/V repeat, no enable_gqa).

    Measured on the 2-core CPU: one sequence 41 us a layer against ~75 for two bf16 matmuls and a softmax, and
    at 16 sequences the same step time; torch's flash kernel keeps the scores in float32 (the matmuls rounded
    them to bf16).  A sequence gets the same bits alone and in any batch: a masked tail changes nothing in the
    kernel's online softmax and padding is to whole blocks (tests/kernels/test_torch_ops.py checks it).  An
    unmasked call over exactly the context (31 us) would not: it rounds differently from the padded batch."""
    n, num_heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    qs = q.view(n, kv_heads, num_heads // kv_heads, head_dim)  # head h reads kv head h // group
    if keys.dtype == torch.float32:
        # float32 (CPUs without bf16): torch's flash kernel rounds differently at different padded lengths
        # here, so two float32 matmuls, which do not (and lose nothing: their scores are float32 already)
        scores = torch.add(bias, torch.matmul(qs, keys.transpose(-1, -2)), alpha=scale)
        return torch.matmul(torch.softmax(scores, dim=-1), vals).view(n, num_heads, head_dim)
    return torch.nn.functional.scaled_dot_product_attention(qs, keys, vals, attn_mask=bias, scale=scale).view(
        n, num_heads, head_dim
    )
