"""Weight-only quantized matmul on CPU through torch's own packed kernels (the ones gpt-fast and torchao use on
CPU): `aten._weight_int4pack_mm_for_cpu` (W4A16, group-wise) and `aten._weight_int8pack_mm` (W8A16, per output
channel); group-wise int8 (GGUF Q8_0) runs exactly as two int4 halves (`pack_for_cpu`).  The weights stay 4 or
8 bits in memory and are never expanded to a dense copy.

Measured on the 2-core Zen 4 dev machine, 30 layers of SmolLM2-135M's matmul shapes with the weights out of
cache (torch 2.13): one decode step at batch 1 takes 9.6 ms dense bf16, 4.2 ms int8, 2.7 ms int4; at batch 16
12.4 / 14.8 / 11.8 ms.  Only bf16 activations are fast: the fp16 and fp32 variants of both kernels are 10-100x
slower (90 ms int4 at batch 1), so `cpu_supported` admits bf16 only and other dtypes keep the reference path.

Layouts: torch's int4 kernel computes w = (q - 8) * scale + zero per group of `group_size` input features, with
`q` repacked by `_convert_weight_to_int4pack_for_cpu` and (scale, zero) in one (K // G, N, 2) tensor.  hearth's
int4 layout (kernels/quant_matmul.py) is w = q * scale + offset, so zero = offset + 8 * scale (exact in fp32,
then rounded once to bf16).  The int8 kernel takes the (N, K) int8 weight as it is and (N,) scales.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kernels.quant_matmul import QuantWeight, unpack_int4

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what _weight_int4pack_mm_for_cpu accepts
FAST_DTYPE = torch.bfloat16


@dataclass
class CpuPackedWeight:
    """A QuantWeight re-laid for torch's CPU kernels.  int4: packed uint8 + (K // G, N, 2) scale/zero;
    int8: the (N, K) int8 weight + (N,) scales."""

    kind: str  # "int4" | "int8" (per channel) | "int8-split" (group-wise: hi and lo int4 halves stacked)
    packed: torch.Tensor
    scales: torch.Tensor
    group_size: int
    in_features: int
    out_features: int
    rows_kernel: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scales.numel() * self.scales.element_size()


def cpu_supported(w: QuantWeight, dtype: torch.dtype) -> bool:
    """True when `w` with activations of `dtype` can take the fast CPU kernels."""
    if dtype != FAST_DTYPE or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return False
    # torch's int4 packing takes N in multiples of 16 (a vocabulary, or a tensor-parallel share, may not be)
    int4_ok = w.group_size in INT4_GROUP_SIZES and w.in_features % w.group_size == 0 and w.out_features % 16 == 0
    if w.kind == "int4":
        return int4_ok
    if w.kind == "int8":  # per output channel (int8 kernel), or group-wise as two int4 halves
        return w.group_size == w.in_features or int4_ok
    return False


def pack_for_cpu(w: QuantWeight, dtype: torch.dtype = FAST_DTYPE) -> CpuPackedWeight:
    """Re-lay `w` for the CPU kernels (ValueError when `cpu_supported` says no)."""
    if not cpu_supported(w, dtype):
        raise ValueError(
            f"no fast CPU kernel for {w.kind} weights with group size {w.group_size} of "
            f"{w.in_features} inputs and {dtype} activations"
        )
    if w.kind == "int8" and w.group_size == w.in_features:
        return CpuPackedWeight(
            "int8",
            w.qweight.contiguous(),
            w.scales.reshape(-1).to(dtype).contiguous(),
            w.group_size,
            w.in_features,
            w.out_features,
        )
    if w.kind == "int8":
        # Group-wise int8 (GGUF Q8_0) as two int4 matmuls, exactly: with u = q + 128 = 16 * hi + lo,
        # d * q = [16 d (hi - 8) + 8 d] + d (lo - 8), i.e. hi with scale 16 d and zero 8 d, lo with scale d and
        # zero 0.  The lo half is small and centred, so the bf16 rounding of the two partial outputs costs about
        # what one dense bf16 matmul's does.  The same bytes as int8, read by the int4 kernel (torch has no
        # group-wise int8 one).
        u = w.qweight.contiguous().view(torch.uint8) ^ 0x80  # q + 128, without a 4-byte-per-weight copy
        scales = w.scales.float()
        halves = [(u >> 4, 16.0 * scales, 8.0 * scales), (u & 15, scales, torch.zeros_like(scales))]
        packed = torch.stack(
            [torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1) for q, _, _ in halves]
        )
        scale_zero = torch.stack([_scale_zero(sc, z, dtype) for _, sc, z in halves])
        return CpuPackedWeight("int8-split", packed, scale_zero, w.group_size, w.in_features, w.out_features)
    q = unpack_int4(w.qweight).to(torch.int32).contiguous()  # (N, K) in 0..15
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales = w.scales.float()
    return CpuPackedWeight(
        "int4",
        packed,
        _scale_zero(scales, w.offsets.float() + 8.0 * scales, dtype),
        w.group_size,
        w.in_features,
        w.out_features,
    )


def _scale_zero(scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(N, K // G) scales and zeros -> the kernel's (K // G, N, 2)."""
    return torch.stack([scales.t(), zeros.t()], dim=-1).to(dtype).contiguous()


def cpu_rows_kernel(w: CpuPackedWeight) -> Callable[[torch.Tensor], torch.Tensor]:
    """quant_matmul_cpu for `w` without bias or checks: a function of contiguous (rows, K) bf16 activations,
    bound once and kept on `w`.  The decode path calls it directly: there the checks and reshapes cost ~40 % of
    a small layer's call."""
    kernel = w.rows_kernel
    if kernel is None:
        kernel = w.rows_kernel = _bind(w)
    return kernel


def _bind(w: CpuPackedWeight) -> Callable[[torch.Tensor], torch.Tensor]:
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    packed, scales, group = w.packed, w.scales, w.group_size
    if w.kind == "int4":
        return lambda x: mm(x, packed, group, scales)
    if w.kind == "int8-split":
        hi, lo, hi_scales, lo_scales = packed[0], packed[1], scales[0], scales[1]
        return lambda x: mm(x, hi, group, hi_scales).add_(mm(x, lo, group, lo_scales))
    int8_mm = torch.ops.aten._weight_int8pack_mm
    return lambda x: int8_mm(x, packed, scales)


def quant_matmul_cpu(x: torch.Tensor, w: CpuPackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (..., K) bf16 -> (..., N) bf16 through torch's packed CPU kernels."""
    if x.dtype != FAST_DTYPE or x.shape[-1] != w.in_features:
        raise ValueError(
            f"quant_matmul_cpu takes (..., {w.in_features}) {FAST_DTYPE} activations, got {tuple(x.shape)} {x.dtype}"
        )
    lead = x.shape[:-1]
    out = cpu_rows_kernel(w)(x.reshape(-1, w.in_features).contiguous())
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*lead, w.out_features)
