"""Paged attention in Triton: decode (one query token per sequence, split over the sequence) and prefill
(a chunk of query tokens per sequence, causal, on top of a cached prefix).

KV cache: (num_blocks, block_size, num_kv_heads, head_dim) for K and for V; block_tables (batch, max_blocks)
int32 maps a sequence's logical block i to a physical block; seq_lens (batch,) counts the tokens of each
sequence already in the cache *including* the ones being attended from (write K/V first, then attend).
GQA: query head h reads KV head h // (num_heads // num_kv_heads).  The cache may hold another float type than
q (read and cast to q's dtype: compute in q's precision).

    out[q] = softmax(scale * q . K[:p+1]^T) V[:p+1]      (p = the query token's position; float32 softmax)

Decode: grid (batch, num_kv_heads, num_splits); a program takes the whole GQA group of one KV head as the
rows of tl.dot and its share of the sequence's cache blocks, keeps an online softmax and writes an unnormalised
partial (acc, max, sum); a few torch ops merge the splits.  The split count comes from block_tables.shape[1]
(host-known: the widest table of the step, or a CUDA graph's fixed width of a whole context), so the launch
needs no sync and does not change between graph replays; each sequence spreads its own blocks evenly over the
splits inside the kernel, so a short sequence in a wide graph table still uses every split (with a fixed
number of blocks per split instead, at batch 16 and 8 KV heads a 512-token context in a 4096-token graph table
would run on 1 of its 4 splits, where the eager launch over a 512-token table gives it all 4).
Prefill: grid (batch, num_heads, query tiles of 16); causal mask aligned to the bottom right (query row i of
a chunk sits at position seq_len - q_len + i).  The references below gather blocks and do it the obvious way.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The `window` the kernels receive for a layer without a sliding window: wider than any context, so the window
# arithmetic (seq_len - window, q_pos - window) needs no branch per program.
NO_WINDOW = 1 << 30

# ---- references -----------------------------------------------------------------------------------------------


def _gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """(length, num_kv_heads, head_dim) float32 of one sequence."""
    bs = cache.shape[1]
    blocks = table[: (length + bs - 1) // bs].long()
    return cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])[:length].float()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """q (n, H, D) at `positions`, k/v (L, KVH, D) -> (n, H, D) float32, causal by position."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float() * scale, k)
    allowed = torch.arange(k.shape[0])[None, :] <= positions.cpu()[:, None]  # (n, L)
    scores = scores.masked_fill(~allowed.to(scores.device)[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(dim=-1), v)


def paged_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q: (batch, num_heads, head_dim), the last token of each sequence -> (batch, num_heads, head_dim)."""
    out = torch.empty_like(q)
    for b, length in enumerate(seq_lens.tolist()):
        k, v = _gather(k_cache, block_tables[b], length), _gather(v_cache, block_tables[b], length)
        out[b] = _attend(q[b : b + 1], k, v, torch.tensor([length - 1]), scale)[0].to(q.dtype)
    return out


def paged_prefill_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q: (total_query_tokens, num_heads, head_dim), sequences packed one after another (cu_query_lens (batch+1,))
    -> same shape: each chunk attends to its cached prefix and causally to itself."""
    out = torch.empty_like(q)
    cu = cu_query_lens.tolist()
    for b, length in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        k, v = _gather(k_cache, block_tables[b], length), _gather(v_cache, block_tables[b], length)
        positions = torch.arange(length - (end - start), length)
        out[start:end] = _attend(q[start:end], k, v, positions, scale).to(q.dtype)
    return out


# ---- decode kernel --------------------------------------------------------------------------------------------


@triton.jit
def _online_softmax_step(q, k, v, allowed, scale, m, l, acc, IEEE: tl.constexpr):
    """One key/value block of the streaming softmax shared by decode and prefill: scores q.k^T (masked where not
    `allowed`), then the running max `m`, sum `l` and unnormalised output `acc` updated for this block.
    K/V are cast to q's dtype first: the cache may be stored in another float type (an fp16 cache under bf16
    compute, the CUDA default of LoadOptions.kv_cache_type "f16" with dtype "auto")."""
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(allowed, s * scale, float("-inf"))  # (rows, BLOCK_SIZE)
    m_new = tl.maximum(m, tl.max(s, axis=1))
    # a row with no allowed key yet (a sliding window's start lies past this block) keeps m = -inf: exponents
    # against 0 instead give p = alpha = 0 rather than exp(-inf + inf) = NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_ref[:, None])
    alpha = tl.exp(m - m_ref)
    l = l * alpha + tl.sum(p, axis=1)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def _decode_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    lens_ptr,
    acc_ptr,
    ml_ptr,
    scale,
    head_dim,
    window,
    s_qb,
    s_qh,
    s_kb,
    s_ks,
    s_kh,
    s_vb,
    s_vs,
    s_vh,
    s_bt,
    s_ab,
    s_ah,
    s_as,
    s_mb,
    s_mh,
    s_ms,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    n_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    per_split = tl.cdiv(n_blocks, tl.num_programs(2))  # this sequence's blocks, spread over all the splits
    first = split * per_split
    last = tl.minimum(first + per_split, n_blocks)  # split 0 is never empty (seq_len >= 1)
    # first position the query may see: seq_len - window with a sliding window (window > 0), else 0; blocks
    # wholly behind it are not read (a split left with none writes max -inf and weighs 0 in the merge)
    lo = tl.maximum(seq_len - window, 0)  # window is NO_WINDOW (2**30) for a layer without one: lo = 0
    first = tl.maximum(first, lo // BLOCK_SIZE)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    t = tl.arange(0, BLOCK_SIZE)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    d_mask = d < head_dim
    q = tl.load(
        q_ptr + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=g_mask[:, None] & d_mask[None, :], other=0.0
    )  # (BLOCK_G, BLOCK_D)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for logical in range(first, last):  # table entries past the sequence's blocks are never read
        phys = tl.load(bt_ptr + b * s_bt + logical).to(tl.int64)
        tok = logical * BLOCK_SIZE + t
        kv_mask = (tok < seq_len)[:, None] & d_mask[None, :]
        k = tl.load(kc_ptr + phys * s_kb + t[:, None] * s_ks + kvh * s_kh + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + phys * s_vb + t[:, None] * s_vs + kvh * s_vh + d[None, :], mask=kv_mask, other=0.0)
        allowed = ((tok < seq_len) & (tok >= lo))[None, :]  # (1, BLOCK_SIZE)
        m, l, acc = _online_softmax_step(q, k, v, allowed, scale, m, l, acc, IEEE)
    out_mask = g_mask[:, None] & d_mask[None, :]
    tl.store(acc_ptr + b * s_ab + heads[:, None] * s_ah + split * s_as + d[None, :], acc, mask=out_mask)
    tl.store(ml_ptr + b * s_mb + heads * s_mh + split * s_ms, m, mask=g_mask)
    tl.store(ml_ptr + b * s_mb + heads * s_mh + split * s_ms + 1, l, mask=g_mask)


def _check_common(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
) -> None:
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(
            f"q must be (tokens or batch, num_heads, head_dim) with unit last stride, got {tuple(q.shape)}"
        )
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"caches {tuple(k_cache.shape)} must be (blocks, block_size, kv_heads, {q.shape[2]})")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches need a unit stride along head_dim")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[2]} KV heads")
    if k_cache.shape[1] < 16 or k_cache.shape[1] & (k_cache.shape[1] - 1):
        raise ValueError(f"block size must be a power of two >= 16, got {k_cache.shape[1]}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_tables (batch, max_blocks) and seq_lens (batch,) must be int32")
    floats = (torch.float16, torch.bfloat16, torch.float32)
    if q.dtype not in floats or k_cache.dtype not in floats or v_cache.dtype != k_cache.dtype:
        raise TypeError(
            f"q and the caches must be fp16/bf16/fp32 (both caches alike), got {q.dtype}, "
            f"{k_cache.dtype} and {v_cache.dtype}"
        )
    if not (q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("Triton paged attention runs on CUDA tensors (or under TRITON_INTERPRET=1)")


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    blocks_per_split: int | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Same contract as paged_decode_reference; every seq_len must be >= 1 and fit its block table.
    window > 0: the query sees only its last `window` positions (kernels/attention.py's sliding window).
    blocks_per_split: the widest table is cut into splits of at most this many blocks, which sets the split
    count (the grid); each sequence then spreads its own blocks over all of them."""
    _check_common(q, k_cache, v_cache, block_tables, seq_lens)
    batch, num_heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if block_tables.shape[0] != batch or seq_lens.shape != (batch,):
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} / seq_lens {tuple(seq_lens.shape)} do not match batch {batch}"
        )
    max_blocks = block_tables.shape[1]
    if blocks_per_split is None:  # aim for ~4 programs per SM-ish worth of work without tiny splits
        target = 512 if q.is_cuda else max_blocks
        blocks_per_split = max(4, triton.cdiv(max_blocks * batch * kv_heads, target))
    num_splits = triton.cdiv(max_blocks, blocks_per_split)
    acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    ml = torch.empty(batch, num_heads, num_splits, 2, dtype=torch.float32, device=q.device)
    group = num_heads // kv_heads
    _decode_kernel[(batch, kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        acc,
        ml,
        scale,
        head_dim,
        window or NO_WINDOW,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        acc.stride(0),
        acc.stride(1),
        acc.stride(2),
        ml.stride(0),
        ml.stride(1),
        ml.stride(2),
        GROUP=group,
        BLOCK_SIZE=block_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        IEEE=q.dtype == torch.float32,
    )
    # Merge the splits: splits past a sequence's end (or wholly behind its window) hold max = -inf and weigh 0.
    m, l = ml[..., 0], ml[..., 1]
    weight = torch.exp(m - m.amax(dim=2, keepdim=True))  # (batch, heads, splits)
    out = (acc * weight[..., None]).sum(dim=2) / (l * weight).sum(dim=2)[..., None]
    return out.to(q.dtype)


# ---- prefill kernel -------------------------------------------------------------------------------------------


@triton.jit
def _prefill_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    lens_ptr,
    cu_ptr,
    out_ptr,
    scale,
    head_dim,
    window,
    s_qt,
    s_qh,
    s_kb,
    s_ks,
    s_kh,
    s_vb,
    s_vs,
    s_vh,
    s_bt,
    s_ot,
    s_oh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    if tile * BLOCK_M < q_len:
        seq_len = tl.load(lens_ptr + b)
        prefix = seq_len - q_len
        kvh = h // GROUP
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        t = tl.arange(0, BLOCK_SIZE)
        row_mask = rows < q_len
        d_mask = d < head_dim
        q = tl.load(
            q_ptr + (q_start + rows)[:, None] * s_qt + h * s_qh + d[None, :],
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )  # (BLOCK_M, BLOCK_D)
        q_pos = prefix + rows
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        last = tl.minimum(prefix + (tile + 1) * BLOCK_M, seq_len)  # keys needed by this tile: [0, last)
        # with a sliding window, blocks before the window of the tile's first row are not read
        start = tl.maximum(prefix + tile * BLOCK_M - window + 1, 0) // BLOCK_SIZE  # 0 with NO_WINDOW
        for logical in range(start, tl.cdiv(last, BLOCK_SIZE)):
            phys = tl.load(bt_ptr + b * s_bt + logical).to(tl.int64)
            tok = logical * BLOCK_SIZE + t
            kv_mask = (tok < seq_len)[:, None] & d_mask[None, :]
            k = tl.load(kc_ptr + phys * s_kb + t[:, None] * s_ks + kvh * s_kh + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(vc_ptr + phys * s_vb + t[:, None] * s_vs + kvh * s_vh + d[None, :], mask=kv_mask, other=0.0)
            allowed = (tok[None, :] <= q_pos[:, None]) & (tok < seq_len)[None, :]  # (BLOCK_M, BLOCK_SIZE)
            allowed = allowed & (tok[None, :] > q_pos[:, None] - window)  # always true with NO_WINDOW
            m, l, acc = _online_softmax_step(q, k, v, allowed, scale, m, l, acc, IEEE)
        out = acc / tl.where(l > 0, l, 1.0)[:, None]  # l = 0 only in padding rows past q_len (not stored)
        tl.store(
            out_ptr + (q_start + rows)[:, None] * s_ot + h * s_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )


def paged_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Same contract as paged_prefill_reference.  Pass max_query_len (the scheduler knows it) to avoid a sync.
    window > 0: each query sees only its last `window` positions."""
    _check_common(q, k_cache, v_cache, block_tables, seq_lens)
    batch = seq_lens.shape[0]
    if cu_query_lens.shape != (batch + 1,) or cu_query_lens.dtype != torch.int32:
        raise ValueError(
            f"cu_query_lens must be int32 ({batch + 1},), got {cu_query_lens.dtype} {tuple(cu_query_lens.shape)}"
        )
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {batch} sequences")
    if max_query_len is None:
        max_query_len = int((cu_query_lens[1:] - cu_query_lens[:-1]).max().item()) if batch else 0
    out = torch.empty_like(q)
    if q.shape[0] == 0 or max_query_len == 0:
        return out
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_m = 16
    _prefill_kernel[(batch, num_heads, triton.cdiv(max_query_len, block_m))](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        cu_query_lens,
        out,
        scale,
        head_dim,
        window or NO_WINDOW,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=num_heads // k_cache.shape[2],
        BLOCK_M=block_m,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        IEEE=q.dtype == torch.float32,
    )
    return out


# ---- the model's contract (kernels/attention.py's AttentionMetadata) ------------------------------------------

# Keys of AttentionMetadata.memo holding the step's device tables, int32: block tables (batch, width) (rows
# zero-padded; entries past a sequence's blocks are never read), sequence lengths (batch,) and cumulative query
# lengths (batch + 1,).  Built from the host tuples by the first layer of a step; a CUDA-graph step
# (backends/torch_engine/cuda_graphs.py) puts its fixed-shape device buffers here instead, and then only these
# tensors and the shape of meta.query_start mean anything: its host tuples are not that step's values.
BLOCK_TABLES = "triton.block_tables"
SEQ_LENS = "triton.seq_lens"
CU_QUERY_LENS = "triton.cu_query_lens"


def step_tables(meta, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block_tables, seq_lens) of the step on `device`, kept in meta.memo: two host-to-device copies per step
    instead of two per layer (each one a synchronous copy from pageable memory)."""
    table = meta.memo.get(BLOCK_TABLES)
    if table is None:
        width = max(len(t) for t in meta.block_tables)
        rows = [tuple(t) + (0,) * (width - len(t)) for t in meta.block_tables]
        table = meta.memo[BLOCK_TABLES] = torch.tensor(rows, dtype=torch.int32).to(device)
        meta.memo[SEQ_LENS] = torch.tensor(meta.context_lens, dtype=torch.int32).to(device)
    return table, meta.memo[SEQ_LENS]


def paged_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float
) -> torch.Tensor:
    """Same contract as kernels.attention.paged_attention_reference (a mixed batch of decodes and chunks,
    meta: AttentionMetadata).  All-decode steps take the split decode kernel; any step with a longer chunk runs
    the prefill kernel over every sequence (a decode is a chunk of one).  Reads the step's tables from
    meta.memo (step_tables) and only the shape of meta.query_start from the host.  A sliding-window layer's
    meta (meta.window > 0) masks, and skips, the positions behind each query's window."""
    table, seq_lens = step_tables(meta, q.device)
    q_lens = [b - a for a, b in zip(meta.query_start, meta.query_start[1:])]
    if all(n == 1 for n in q_lens):
        return paged_decode_triton(q, k_cache, v_cache, table, seq_lens, scale, window=meta.window)
    cu = meta.memo.get(CU_QUERY_LENS)
    if cu is None:
        cu = meta.memo[CU_QUERY_LENS] = torch.tensor(meta.query_start, dtype=torch.int32).to(q.device)
    return paged_prefill_triton(
        q, k_cache, v_cache, table, seq_lens, cu, scale, max_query_len=max(q_lens), window=meta.window
    )
