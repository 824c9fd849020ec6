"""Triton matmul for more than 16 rows of "q6" weights (GGUF Q6_K as it is, kernels/quant_matmul.py), and the
checks every q6 call passes first.

out[m, n] = sum_k x[m, k] * d[n, k // 256] * sc[n, k // 16] * (q[n, k] - 32)

Why a tl.dot kernel and not "dequantize to the compute dtype, then one matmul": the dense copy is transient but
whole, and the largest q6 weight is a Q4_K_M model's output head (Llama 3 8B: 128256 x 4096, 1 GiB in bf16 for
every call with more than 16 rows, on top of the 0.4 GiB it holds), and it writes and reads 4 bytes a weight to
save none: batched decode of 17-64 sequences, the common case past 16 rows, reads the weights once per 16-64
rows here instead.  Long prefills would be faster through cuBLAS on a dense copy; that trade is not measured.

Each program owns a (BLOCK_M, BLOCK_N) output tile and walks K a 64-weight chunk at a time (qhigh's unit).  A
chunk's 32 nibble bytes and 16 high-bit bytes are read once and decoded into four planes of 16 weights: plane
(h, o) holds weights 32h + 2b + o (b 0..15), the nibble o of nibble byte 16h + b and bits 2 (2h + o) of high
byte b, so every plane is whole bytes read contiguously and meets its own 16 columns of x (a stride-2 load) in
one tl.dot of depth 16.  The weights are scaled in float32 (d * sc, exact) and cast to x's dtype for the dot,
as the int4 / int8 tl.dot kernel does (kernels/quant_matmul_triton.py).  Untuned: no GPU has timed it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.q6_gemv_triton import value_at
from kernels.quant_matmul import QuantWeight


@triton.jit
def _q6_dot_kernel(
    x_ptr,
    l_ptr,
    h_ptr,
    s_ptr,
    d_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ln,
    stride_hn,
    stride_sn,
    stride_dn,
    stride_om,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rb = tl.arange(0, 16)
    m_mask = rm < M
    n_mask = rn < N
    w_mask = n_mask[None, :]  # (1, BLOCK_N): every K index of a chunk is in range (K is a multiple of 256)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c in range(0, K // 64):
        # (16, BLOCK_N) tiles: high byte b, and nibble byte 16h + b, of the chunk, for each output n
        hb = tl.load(h_ptr + rn[None, :] * stride_hn + (c * 16 + rb)[:, None], mask=w_mask, other=0).to(tl.int32)
        d = tl.load(d_ptr + rn * stride_dn + c // 4, mask=n_mask, other=0.0).to(tl.float32)  # (BLOCK_N,)
        for h in tl.static_range(2):
            lb = tl.load(l_ptr + rn[None, :] * stride_ln + (c * 32 + 16 * h + rb)[:, None], mask=w_mask, other=0)
            lb = lb.to(tl.int32)
            # plane weights 32h + 2b + o fall in sub-blocks 2h (b < 8) and 2h + 1 (b >= 8) of the chunk
            sub = c * 4 + 2 * h + rb // 8
            sc = tl.load(s_ptr + rn[None, :] * stride_sn + sub[:, None], mask=w_mask, other=0).to(tl.float32)
            scale = sc * d[None, :]  # (16, BLOCK_N), exact: an fp16 times an int8
            for o in tl.static_range(2):
                q = ((lb >> (4 * o)) & 0xF) | (((hb >> (2 * (2 * h + o))) & 3) << 4)
                w = value_at(q, 0) * scale  # q - 32 by bit tricks, no cvt (q6_gemv_triton)
                xk = c * 64 + 32 * h + 2 * rb + o
                xt = tl.load(x_ptr + rm[:, None] * stride_xm + xk[None, :], mask=m_mask[:, None], other=0.0)
                if IEEE:
                    acc += tl.dot(xt.to(tl.float32), w, input_precision="ieee")
                else:
                    acc += tl.dot(xt, w.to(xt.dtype))
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def check_q6(x: torch.Tensor, w: QuantWeight) -> None:
    """Raise unless `w` is a well-formed q6 weight that x's last dimension meets, on x's device."""
    n, k = w.out_features, w.in_features
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"activations must be fp16, bf16 or fp32, got {x.dtype}")
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight expects {k}")
    if k % 256 or w.group_size != 16:
        raise ValueError(f"q6 needs in_features a multiple of 256 and group size 16, got {k} and {w.group_size}")
    want = {
        "qweight": (torch.uint8, (n, k // 2)),
        "qhigh": (torch.uint8, (n, k // 4)),
        "scales": (torch.int8, (n, k // 16)),
        "super_scales": (torch.float16, (n, k // 256)),
    }
    for field, (dtype, shape) in want.items():
        t = getattr(w, field)
        if t is None or t.dtype != dtype or tuple(t.shape) != shape:
            got = None if t is None else f"{t.dtype} {tuple(t.shape)}"
            raise ValueError(f"q6 {field} must be {dtype} {shape}, got {got}")
        if t.stride(-1) != 1 or t.device != x.device:
            raise ValueError(f"q6 {field} must be contiguous along K and on x's device {x.device}, it is on {t.device}")


def q6_matmul_triton(x2: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x2: (M, K) -> (M, N) in x2's dtype, any M (no bias: the caller adds it); check_q6 has passed."""
    m, n = x2.shape[0], w.out_features
    out = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    if m == 0:
        return out
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n = 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _q6_dot_kernel[grid](
        x2,
        w.qweight,
        w.qhigh,
        w.scales,
        w.super_scales,
        out,
        m,
        n,
        w.in_features,
        x2.stride(0),
        w.qweight.stride(0),
        w.qhigh.stride(0),
        w.scales.stride(0),
        w.super_scales.stride(0),
        out.stride(0),
        IEEE=x2.dtype == torch.float32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
    )
    return out
