"""SwiGLU gate in Triton: out = silu(gate) * up for x = [gate | up], same contract as kernels/activation.py.

One program per (token, BLOCK columns); math in float32, one read of x and one write of out.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, ffn, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ffn
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + ffn + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x: (..., 2 * ffn) -> (..., ffn) in x's dtype (leading dimensions flattened to rows)."""
    if x.dim() != 2 and x.dim() > 0:
        return silu_and_mul_triton(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], x.shape[-1] // 2)
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be (num_tokens, 2 * ffn) with unit last stride, got {tuple(x.shape)}")
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("Triton silu_and_mul runs on CUDA tensors (or under TRITON_INTERPRET=1)")
    ffn = x.shape[1] // 2
    out = torch.empty(x.shape[0], ffn, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        block = min(1024, triton.next_power_of_2(ffn))
        _silu_and_mul_kernel[(x.shape[0], triton.cdiv(ffn, block))](
            x, out, ffn, x.stride(0), out.stride(0), BLOCK=block
        )
    return out
