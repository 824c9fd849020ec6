"""Grouped expert matmul in Triton: every expert's rows times its own weight, one launch over all experts.

    out[r] = x[r] @ w[e(r)]^T      for the rows r of expert e, offsets[e] <= r < offsets[e + 1]

The rows come sorted by expert (kernels/moe.py sort_by_expert).  The launch grid is (row tiles, column tiles),
where the row tiles are laid out expert by expert: expert e owns ceil(count_e / BLOCK_M) tiles, each of which
multiplies up to BLOCK_M of e's rows by BLOCK_N columns of w[e].  The tile table (`tile_table`) is built on the
device without reading the counts on the host (no synchronisation), for the upper bound of
ceil(M / BLOCK_M) + E tiles; the spare tiles have no rows and store nothing.  The reference is
kernels/moe.py's grouped_matmul_torch (one torch matmul per expert); `moe_experts_triton` is moe_experts_grouped
with this kernel and the Triton silu_and_mul.  Float32 accumulation; fp16/bf16/fp32 inputs (the interpreter,
used by the tests on CPU, does no bf16 arithmetic: tested there in fp16 and fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.activation_triton import silu_and_mul_triton
from kernels.moe import grouped_matmul_torch, moe_experts_grouped

__all__ = ["grouped_matmul_torch", "grouped_matmul_triton", "moe_experts_triton", "tile_table"]

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32


@triton.jit
def _grouped_mm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_wk,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_expert_ptr + tile).to(tl.int64)
    start = tl.load(tile_start_ptr + tile)
    end = tl.load(tile_end_ptr + tile)
    rows = start + tl.arange(0, BLOCK_M)
    row_mask = rows < end
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w_ptr + e * stride_we
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        a = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )  # (BLOCK_M, BLOCK_K)
        b = tl.load(
            w_base + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk,
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        )  # (BLOCK_K, BLOCK_N)
        if IEEE:  # float32 inputs: full-precision products, not TF32 (the reference is exact float32)
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & col_mask[None, :],
    )


def tile_table(offsets: torch.Tensor, n_rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert, first row, end row) of each row tile, int32, for ceil(n_rows / block_m) + E tiles: expert e's
    tiles cover offsets[e]:offsets[e + 1] in steps of block_m; the tiles past the last one are empty."""
    n_experts = offsets.numel() - 1
    counts = offsets[1:] - offsets[:-1]
    tiles = (counts + block_m - 1) // block_m  # (E,)
    tile_end_cum = torch.cumsum(tiles, 0)  # tiles of experts 0..e
    n_tiles = -(-n_rows // block_m) + n_experts
    t = torch.arange(n_tiles, device=offsets.device)
    e = torch.searchsorted(tile_end_cum, t, right=True)  # the expert whose tiles include t (E: none)
    valid = e < n_experts
    e = e.clamp(max=n_experts - 1)
    first_tile = tile_end_cum[e] - tiles[e]
    start = offsets[e] + (t - first_tile) * block_m
    end = torch.minimum(start + block_m, offsets[e + 1])
    start = torch.where(valid, start, torch.zeros_like(start))
    end = torch.where(valid, end, torch.zeros_like(end))
    return e.to(torch.int32), start.to(torch.int32), end.to(torch.int32)


def grouped_matmul_triton(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x (M, K) rows sorted by expert, w (E, N, K), offsets (E + 1,) -> (M, N) in x's dtype."""
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError(
            f"grouped_matmul: x {tuple(x.shape)} and w {tuple(w.shape)} do not multiply (want x (M, K), w (E, N, K))"
        )
    if offsets.numel() != w.shape[0] + 1:
        raise ValueError(f"grouped_matmul: {offsets.numel()} offsets for {w.shape[0]} experts (want E + 1)")
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.dtype != x.dtype:
        raise ValueError(f"grouped_matmul: x is {x.dtype} but w is {w.dtype}")
    m, n = x.shape[0], w.shape[1]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    experts, starts, ends = tile_table(offsets, m, BLOCK_M)
    grid = (experts.numel(), triton.cdiv(n, BLOCK_N))
    _grouped_mm_kernel[grid](
        x,
        w,
        out,
        experts,
        starts,
        ends,
        n,
        x.shape[1],
        x.stride(0),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        IEEE=x.dtype == torch.float32,
    )
    return out


def moe_experts_triton(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """kernels/moe.py moe_experts_reference's result with two grouped Triton matmuls."""
    return moe_experts_grouped(x, gate_up, down, weights, ids, grouped_matmul_triton, silu_and_mul_triton)
