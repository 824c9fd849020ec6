"""Triton weight-only quantized matmul for the layouts in kernels/quant_matmul.py (read its docstring first).

out[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, k // G] (+ offset[n, k // G]))

Calls of 1 to 16 rows of int4 / int8 weights in 32-multiples go to kernels/quant_gemv_triton.py (no MMA tile
to pad one row to); this kernel serves the rest.  q6 weights (GGUF Q6_K as it is) have kernels of their own:
kernels/q6_gemv_triton.py for 1 to 16 rows, kernels/q6_matmul_triton.py's tl.dot kernel for more.  One kernel for
the three kinds (a constexpr picks how a weight tile is decoded).  Each program owns a
(BLOCK_M, BLOCK_N) output tile and walks K in BLOCK_K steps: it loads the quantized tile (for int4 the packed
bytes once, each nibble plane then multiplied with its half of x's columns), scales it in float32, casts to x's
dtype and feeds tl.dot with a float32 accumulator.  Decode (M = 1..16) reads each weight byte exactly once, which
is what bounds its speed; SPLIT_K > 1 splits K over more programs (float32 atomics into a workspace) so that small-N
layers still fill every SM.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels import q6_gemv_triton, q6_matmul_triton
from kernels import quant_gemv_triton as gemv
from kernels.quant_matmul import QuantWeight

_KINDS = {"int8": 0, "int4": 1, "fp8": 2}
_QDTYPES = {"int8": torch.int8, "int4": torch.uint8, "fp8": torch.float8_e4m3fn}


@triton.jit
def _wq_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    M,
    N,
    K,
    group_size,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sg,
    stride_om,
    stride_on,
    KIND: tl.constexpr,
    SPLIT_K: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = pid_k * k_per_split
    for k0 in range(0, k_per_split, BLOCK_K):
        if KIND == 1:
            # int4: byte j holds columns 2j (low nibble) and 2j + 1 (high nibble).  The packed tile is read once,
            # contiguously along K (a (BLOCK_K, BLOCK_N) tile indexed by k // 2 read every byte twice through
            # a pointer Triton could not prove contiguous: 0.9% of the HBM roofline on the first GPU run), and
            # each nibble plane meets its own half of x's columns: two dots of BLOCK_K / 2.
            rh = (k_begin + k0) // 2 + tl.arange(0, BLOCK_K // 2)  # packed byte (column pair) index
            h_mask = rh < K // 2
            wk_mask = h_mask[:, None] & n_mask[None, :]
            wq = tl.load(w_ptr + rn[None, :] * stride_wn + rh[:, None] * stride_wk, mask=wk_mask, other=0)
            wq = wq.to(tl.int32)  # (BLOCK_K / 2, BLOCK_N)
            g = (2 * rh[:, None]) // group_size  # both nibbles of a byte share a group (G is even)
            s = tl.load(s_ptr + rn[None, :] * stride_sn + g * stride_sg, mask=wk_mask, other=0.0).to(tl.float32)
            o = tl.load(o_ptr + rn[None, :] * stride_sn + g * stride_sg, mask=wk_mask, other=0.0).to(tl.float32)
            w_lo = (wq & 0xF).to(tl.float32) * s + o
            w_hi = ((wq >> 4) & 0xF).to(tl.float32) * s + o
            x_mask = m_mask[:, None] & h_mask[None, :]
            x_row = x_ptr + rm[:, None] * stride_xm
            x_even = tl.load(x_row + (2 * rh[None, :]) * stride_xk, mask=x_mask, other=0.0)  # (BLOCK_M, BLOCK_K / 2)
            x_odd = tl.load(x_row + (2 * rh[None, :] + 1) * stride_xk, mask=x_mask, other=0.0)
            if IEEE:
                acc += tl.dot(x_even.to(tl.float32), w_lo, input_precision="ieee")
                acc += tl.dot(x_odd.to(tl.float32), w_hi, input_precision="ieee")
            else:
                acc += tl.dot(x_even, w_lo.to(x_even.dtype))
                acc += tl.dot(x_odd, w_hi.to(x_odd.dtype))
        else:
            rk = k_begin + k0 + tl.arange(0, BLOCK_K)
            k_mask = rk < K
            x = tl.load(
                x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )  # (BLOCK_M, BLOCK_K)
            wk_mask = k_mask[:, None] & n_mask[None, :]
            w_ptrs = w_ptr + rn[None, :] * stride_wn + rk[:, None] * stride_wk
            if KIND == 2:
                # fp8: no `other=` (an integer 0 cannot be cast to fp8e4nv on real Triton: 3.6 refused to
                # compile it, the interpreter accepted it); masked-off lanes are zeroed after the cast instead, so
                # no fp8 NaN meets 0 * NaN below
                w = tl.where(wk_mask, tl.load(w_ptrs, mask=wk_mask).to(tl.float32), 0.0)
            else:
                w = tl.load(w_ptrs, mask=wk_mask, other=0).to(tl.float32)
            g = rk[:, None] // group_size
            s = tl.load(s_ptr + rn[None, :] * stride_sn + g * stride_sg, mask=wk_mask, other=0.0).to(tl.float32)
            w = w * s  # (BLOCK_K, BLOCK_N)
            if IEEE:
                acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(x.dtype))
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=out_mask)


def _runnable(t: torch.Tensor) -> bool:
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _check(x: torch.Tensor, w: QuantWeight) -> None:
    if w.kind not in _KINDS:
        raise ValueError(f"unknown quantized weight kind {w.kind!r}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"activations must be fp16, bf16 or fp32, got {x.dtype}")
    if x.shape[-1] != w.in_features:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight expects {w.in_features}")
    if w.qweight.dtype != _QDTYPES[w.kind]:
        raise TypeError(f"{w.kind} qweight must be {_QDTYPES[w.kind]}, got {w.qweight.dtype}")
    packed_k = w.in_features // 2 if w.kind == "int4" else w.in_features
    if tuple(w.qweight.shape) != (w.out_features, packed_k):
        raise ValueError(f"{w.kind} qweight shape {tuple(w.qweight.shape)}, expected {(w.out_features, packed_k)}")
    if w.in_features % w.group_size or (w.kind == "int4" and w.group_size % 2):
        raise ValueError(f"group size {w.group_size} does not divide in_features {w.in_features} evenly")
    groups = (w.out_features, w.in_features // w.group_size)
    if tuple(w.scales.shape) != groups:
        raise ValueError(f"scales shape {tuple(w.scales.shape)}, expected {groups}")
    if w.kind == "int4":
        if w.offsets is None or tuple(w.offsets.shape) != groups or w.offsets.stride() != w.scales.stride():
            raise ValueError(f"int4 offsets must be {groups} with the same strides as the scales")
    tensors = [x, w.qweight, w.scales] + ([w.offsets] if w.offsets is not None else [])
    if any(t.device != x.device for t in tensors):
        raise ValueError("x and the quantized weight must be on the same device")
    if not _runnable(x):
        raise RuntimeError("the Triton quantized matmul runs on CUDA tensors (or under TRITON_INTERPRET=1)")
    if w.kind == "fp8" and x.is_cuda and torch.cuda.get_device_capability(x.device) < (8, 9):
        raise RuntimeError("FP8 weights need compute capability 8.9 or newer; use int8 on this GPU")


def _pick_blocks(m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K) by problem size: decode-sized M gets narrow tiles and split K."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n = 64 if m <= 16 else 128
    block_k = 128 if k >= 128 else max(16, triton.next_power_of_2(k))
    split_k = 1
    if m <= 16 and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        tiles = triton.cdiv(n, block_n)
        while tiles * split_k < sms and k // (block_k * split_k * 2) >= 4:
            split_k *= 2
    return block_m, block_n, block_k, split_k


def quant_matmul_triton(
    x: torch.Tensor,
    w: QuantWeight,
    bias: torch.Tensor | None = None,
    *,
    blocks: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """x: (..., K) -> (..., N) in x's dtype.  blocks = (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K) overrides the choice
    (tests use it to exercise edge tiles and split K on tiny shapes; q6 takes none)."""
    if w.kind == "q6":
        if blocks is not None:
            raise ValueError("blocks sets the int4 / int8 / fp8 kernel's tiles; q6 weights have kernels of their own")
        return _q6_matmul(x, w, bias)
    _check(x, w)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)  # (M, K)
    m, n, k = x2.shape[0], w.out_features, w.in_features
    if blocks is None and gemv.supports(w, m):  # decode rows: the kernel without MMA tiles (quant_gemv_triton.py)
        out = gemv.quant_gemv_triton(x2, w)
        if bias is not None:
            out = out + bias.to(x.dtype)
        return out.reshape(*lead, n)
    block_m, block_n, block_k, split_k = blocks or _pick_blocks(m, n, k, x.device)
    if w.kind == "int4":
        block_k = max(block_k, 32)  # its two dots are BLOCK_K / 2 deep, and tl.dot needs 16
    out_dtype = torch.float32 if split_k > 1 else x.dtype
    out = (torch.zeros if split_k > 1 else torch.empty)((m, n), device=x.device, dtype=out_dtype)
    if m == 0:
        return out.to(x.dtype).reshape(*lead, n)
    offsets = w.offsets if w.offsets is not None else w.scales  # unused unless int4
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split_k)
    _wq_matmul_kernel[grid](
        x2,
        w.qweight,
        w.scales,
        offsets,
        out,
        m,
        n,
        k,
        w.group_size,
        x2.stride(0),
        x2.stride(1),
        w.qweight.stride(0),
        w.qweight.stride(1),
        w.scales.stride(0),
        w.scales.stride(1),
        out.stride(0),
        out.stride(1),
        KIND=_KINDS[w.kind],
        SPLIT_K=split_k,
        IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    out = out.to(x.dtype)
    if bias is not None:
        out = out + bias.to(x.dtype)
    return out.reshape(*lead, n)


def _q6_matmul(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """q6: 1 to 16 rows to the decode kernel (kernels/q6_gemv_triton.py), more to the tl.dot kernel."""
    q6_matmul_triton.check_q6(x, w)
    if not _runnable(x):
        raise RuntimeError("the Triton quantized matmul runs on CUDA tensors (or under TRITON_INTERPRET=1)")
    x2 = x.reshape(-1, w.in_features)  # (M, K)
    if q6_gemv_triton.supports(w, x2.shape[0]):
        out = q6_gemv_triton.q6_gemv_triton(x2, w)
    else:
        out = q6_matmul_triton.q6_matmul_triton(x2, w)
    if bias is not None:
        out = out + bias.to(x.dtype)
    return out.reshape(*x.shape[:-1], w.out_features)
