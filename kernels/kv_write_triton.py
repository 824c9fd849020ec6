"""Write new keys/values into the paged KV cache through a slot mapping.

    slot = block_id * block_size + offset_in_block;  k_cache[slot // bs, slot % bs] = key[token]  (same for v)

Cache layout: (num_blocks, block_size, num_kv_heads, head_dim) (any strides).  slot_mapping (num_tokens,)
int32/int64; a negative slot means "padding token: write nothing" (CUDA-graph batches are padded).
`kv_write_reference` is the obvious indexed assignment; one Triton program writes one token's heads.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def kv_write_reference(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """key/value: (num_tokens, num_kv_heads, head_dim); writes in place."""
    bs = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache[slots // bs, slots % bs] = key[keep].to(k_cache.dtype)
    v_cache[slots // bs, slots % bs] = value[keep].to(v_cache.dtype)


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    num_heads,
    head_dim,
    block_size,
    s_kt,
    s_kh,
    s_vt,
    s_vh,
    s_cb,
    s_cs,
    s_ch,
    s_vcb,
    s_vcs,
    s_vch,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // block_size
        off = slot % block_size
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < num_heads) & (d < head_dim)
        k = tl.load(k_ptr + t * s_kt + h * s_kh + d, mask=mask)
        v = tl.load(v_ptr + t * s_vt + h * s_vh + d, mask=mask)
        tl.store(kc_ptr + blk * s_cb + off * s_cs + h * s_ch + d, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + blk * s_vcb + off * s_vcs + h * s_vch + d, v.to(vc_ptr.dtype.element_ty), mask=mask)


def kv_write_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    memo: dict | None = None,
) -> None:
    """Same contract as kv_write_reference (in place); `memo` (attention.write_kv's per-step memo) is unused.
    Slots are not bounds-checked on the GPU (that would need a sync); the scheduler's block tables guarantee
    them, and the reference checks them on CPU."""
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must both be (tokens, heads, dim)")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != tuple(key.shape[1:]):
        raise ValueError(f"caches {tuple(k_cache.shape)} must be (blocks, block_size, {key.shape[1]}, {key.shape[2]})")
    if slot_mapping.shape != (key.shape[0],) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping must be int32/int64 ({key.shape[0]},), got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if key.stride(-1) != 1 or value.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("key, value and caches need a unit stride along head_dim")
    if not (key.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("Triton KV write runs on CUDA tensors (or under TRITON_INTERPRET=1)")
    if key.shape[0] == 0:
        return
    _kv_write_kernel[(key.shape[0],)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.shape[1],
        key.shape[2],
        k_cache.shape[1],
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_H=triton.next_power_of_2(key.shape[1]),
        BLOCK_D=triton.next_power_of_2(key.shape[2]),
    )
