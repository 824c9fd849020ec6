"""Fused residual-add + RMSNorm in Triton (one read of x and residual, one write of each output).

    residual_out = x + residual                      (stored in x's dtype: the stream the next layer adds to)
    out = residual_out / sqrt(mean(residual_out^2) + eps) * weight   (float32 math, cast to x's dtype)

Without a residual it is plain RMSNorm.  The references are `rms_norm_reference` (kernels/rmsnorm.py) and
`fused_add_rms_norm_reference` (both in kernels/rmsnorm.py); one program normalises one row.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.rmsnorm import fused_add_rms_norm_reference, rms_norm_reference  # noqa: F401 - re-exported


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    r_out_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(r_out_ptr.dtype.element_ty)  # round like the reference: the sum is stored in x's dtype
        tl.store(r_out_ptr + row * stride_ro + cols, x, mask=mask)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(var + eps) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be (num_tokens, hidden) with unit last stride, got {tuple(x.shape)}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match hidden {x.shape[1]}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1 or residual.dtype != x.dtype):
        raise ValueError("residual must have x's shape and dtype and a unit last stride")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"rms norm takes fp16, bf16 or fp32, got {x.dtype}")
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("Triton RMSNorm runs on CUDA tensors (or under TRITON_INTERPRET=1)")


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same contract as kernels.rmsnorm.rms_norm_reference; x: (..., hidden), flattened to rows."""
    if x.dim() != 2:
        return rms_norm_triton(x.reshape(-1, x.shape[-1]), weight, eps).reshape(x.shape)
    _check(x, weight, None)
    out = torch.empty_like(x)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x,
            x,
            weight,
            out,
            out,
            x.shape[1],
            eps,
            x.stride(0),
            0,
            out.stride(0),
            0,
            HAS_RESIDUAL=False,
            BLOCK=triton.next_power_of_2(x.shape[1]),
        )
    return out


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as fused_add_rms_norm_reference: returns (normed, x + residual)."""
    _check(x, weight, residual)
    out, r_out = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x,
            residual,
            weight,
            out,
            r_out,
            x.shape[1],
            eps,
            x.stride(0),
            residual.stride(0),
            out.stride(0),
            r_out.stride(0),
            HAS_RESIDUAL=True,
            BLOCK=triton.next_power_of_2(x.shape[1]),
        )
    return out, r_out
