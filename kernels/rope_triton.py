"""Rotary embedding (rotate-half layout) in Triton, same contract as kernels/rope.py's `rope_torch`.

cos/sin (num_tokens, 1, head_dim // 2) come from `rope_cos_sin(positions, rope_inv_freq(...))`, so every
frequency scaling (linear, Llama 3's per-band smoothing, GGUF rope_freqs) is already in them; the kernel only
rotates.  One program per token rotates all query and key heads of that token (math in float32).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    num_heads,
    half,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    stride_ct,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (d < half)
    c = tl.load(cos_ptr + t * stride_ct + d, mask=d < half, other=0.0)
    s = tl.load(sin_ptr + t * stride_ct + d, mask=d < half, other=0.0)
    base = x_ptr + t * stride_xt + h * stride_xh
    a = tl.load(base + d, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(base + half + d, mask=mask, other=0.0).to(tl.float32)
    obase = out_ptr + t * stride_ot + h * stride_oh
    tl.store(obase + d, (a * c - b * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(obase + half + d, (b * c + a * s).to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    t, h, d = x.shape
    if t:
        _rope_kernel[(t,)](
            x,
            out,
            cos,
            sin,
            h,
            d // 2,
            x.stride(0),
            x.stride(1),
            out.stride(0),
            out.stride(1),
            cos.stride(0),
            BLOCK_H=triton.next_power_of_2(h),
            BLOCK_D=triton.next_power_of_2(d // 2),
        )
    return out


def rope_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (num_tokens, num_heads, head_dim); k: (num_tokens, num_kv_heads, head_dim); cos/sin float32
    (num_tokens, 1, head_dim // 2).  Returns rotated copies in q's / k's dtype."""
    for name, x in (("q", q), ("k", k)):
        if x.dim() != 3 or x.stride(-1) != 1 or x.shape[-1] % 2:
            raise ValueError(
                f"{name} must be (num_tokens, heads, even head_dim) with unit last stride, got {tuple(x.shape)}"
            )
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on tokens or head_dim")
    want = (q.shape[0], 1, q.shape[2] // 2)
    for name, c in (("cos", cos), ("sin", sin)):
        if tuple(c.shape) != want or c.dtype != torch.float32 or c.stride(-1) != 1:
            raise ValueError(f"{name} must be float32 {want}, got {c.dtype} {tuple(c.shape)}")
    if cos.stride() != sin.stride():
        raise ValueError("cos and sin must share strides")
    if not (q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("Triton RoPE runs on CUDA tensors (or under TRITON_INTERPRET=1)")
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
