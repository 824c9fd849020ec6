"""Weight-only quantized matmul: out = x @ dequant(W)^T, activations stay fp16/bf16/fp32 (W8A16, W4A16, FP8).

Layouts (one for each kind; the Triton kernels in quant_matmul_triton.py read exactly these):

int8  (W8A16): qweight int8 (N, K); scales (N, K // G). w[n, k] = qweight[n, k] * scales[n, k // G].
      G = K is per-output-channel (round-to-nearest from fp16); G = 32 is GGUF Q8_0 repacked as is.
int4  (W4A16): qweight uint8 (N, K // 2), two values per byte: k = 2j in the low nibble, k = 2j + 1 in the high
      nibble of byte j; scales and offsets (N, K // G). w[n, k] = q[n, k] * scales[n, k // G] + offsets[n, k // G],
      q in 0..15.  A float offset rather than an integer zero point, so one layout holds round-to-nearest
      asymmetric groups (offset = group min), GGUF Q4_0 (offset = -8 d), Q4_1 (offset = m) and Q4_K
      (offset = -dmin * min) without requantising.  G = 128 by default, 32 for GGUF blocks.
fp8   : qweight float8_e4m3fn (N, K); scales (N, 1). w[n, k] = float(qweight[n, k]) * scales[n, 0].
      The Triton path needs compute capability >= 8.9 (Ada/Hopper); elsewhere only the reference runs.
q6    : GGUF Q6_K as it is (no requantization: 6.5625 bits a weight); K a multiple of 256, group_size 16.
      w[n, k] = super_scales[n, k // 256] * scales[n, k // 16] * (q[n, k] - 32), q in 0..63 of 6 bits.
      qweight uint8 (N, K // 2): q's low 4 bits, packed as int4's (k = 2j low nibble, 2j + 1 high nibble of byte j).
      qhigh uint8 (N, K // 4): q's high 2 bits, four to a byte, in chunks of 64 weights: byte 16c + b holds those
      of weights 64c + 2b, 64c + 2b + 1, 64c + 32 + 2b, 64c + 32 + 2b + 1 in bits 0-1, 2-3, 4-5, 6-7.  Why that
      order (kernels/q6_gemv_triton.py): int32 word w of a chunk's qhigh holds the high bits of just the weights
      of nibble word w of each 32-weight half of the chunk, byte i those of nibble byte i, so one shift and one
      mask set the high bits of four values beside their nibbles, a value a byte (`lo & 0x0F0F0F0F | hi_shifted
      & 0x30303030`).  scales int8 (N, K // 16): Q6_K's sub-scales; super_scales float16 (N, K // 256): its d.
      Triton kernels on CUDA and the reference elsewhere: no CPU kernel (q6 is meant for GPUs alone).

Scales and offsets of int8 / int4 / fp8 are stored in the activation dtype (fp16 or bf16) or float32.
Bytes per weight: int8 1 + 2/G, int4 0.5 + 4/G (4.25 bits at G = 128), fp8 1, q6 0.5 + 0.25 + 1/16 + 2/256 = 0.8203.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass
class QuantWeight:
    """A quantized (N, K) weight in one of the layouts above (the seam between quantize transforms and kernels)."""

    kind: str  # "int8" | "int4" | "fp8" | "q6"
    qweight: torch.Tensor  # int8 (N, K) | uint8 (N, K // 2) | float8_e4m3fn (N, K) | q6: uint8 (N, K // 2)
    scales: torch.Tensor  # (N, K // group_size); q6: int8 sub-scales (N, K // 16)
    offsets: torch.Tensor | None  # int4 only: (N, K // group_size); None for int8 / fp8 / q6
    group_size: int  # input features per scale; K for per-channel
    in_features: int  # K
    out_features: int  # N
    qhigh: torch.Tensor | None = None  # q6 only: uint8 (N, K // 4), the values' high 2 bits (layout above)
    super_scales: torch.Tensor | None = None  # q6 only: float16 (N, K // 256), one d per 256 weights

    def to(self, device: torch.device | str) -> QuantWeight:
        return self.map_rows(lambda t: t.to(device))

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> QuantWeight:
        """The weight with `fn` applied to each of its tensors along their first dimension, the output rows (every
        layout keeps every field per output row): a move, a row slice, a reorder of the rows.  out_features is
        the result's row count."""

        def each(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)

        qweight = fn(self.qweight)
        return QuantWeight(
            self.kind,
            qweight,
            fn(self.scales),
            each(self.offsets),
            self.group_size,
            self.in_features,
            int(qweight.shape[0]),
            each(self.qhigh),
            each(self.super_scales),
        )

    @property
    def column_unit(self) -> int:
        """The fewest input columns a slice of this weight may start or end on and stay quantized: a group, or q6's
        256-weight block (its super-scale and its high bits' 64-weight chunks)."""
        return 256 if self.kind == "q6" else self.group_size

    def columns(self, lo: int, hi: int) -> QuantWeight | None:
        """Input columns [lo, hi) as a QuantWeight of their own (copies), or None when an end falls inside a
        column_unit (hi may be in_features)."""
        unit = self.column_unit
        if lo % unit or (hi % unit and hi != self.in_features) or not 0 <= lo < hi <= self.in_features:
            return None

        def cut(t: torch.Tensor | None, per: int) -> torch.Tensor | None:  # per: input columns a stored column holds
            return None if t is None else t[:, lo // per : -(-hi // per)].contiguous()

        return QuantWeight(
            self.kind,
            cut(self.qweight, 2 if self.kind in ("int4", "q6") else 1),  # type: ignore[arg-type]
            cut(self.scales, self.group_size),  # type: ignore[arg-type]
            cut(self.offsets, self.group_size),
            self.group_size,
            hi - lo,
            self.out_features,
            cut(self.qhigh, 4),
            cut(self.super_scales, 256),
        )

    @property
    def nbytes(self) -> int:
        parts = (getattr(self, f) for f in TENSOR_FIELDS)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


# every layout's tensors, in QuantWeight's order (None where a layout has none); a module holding a QuantWeight keeps
# them as buffers of these names, so byte counts and the prepared-weight cache see them (QuantLinear, QuantEmbedding)
TENSOR_FIELDS = ("qweight", "scales", "offsets", "qhigh", "super_scales")


def register_weight(module: torch.nn.Module, w: QuantWeight) -> None:
    """Hold `w`'s tensors as buffers of `module`, under TENSOR_FIELDS' names."""
    for field in TENSOR_FIELDS:
        module.register_buffer(field, getattr(w, field))


def held_weight(
    module: torch.nn.Module, kind: str, group_size: int, in_features: int, out_features: int
) -> QuantWeight:
    """The QuantWeight whose tensors `module` holds (register_weight)."""
    qweight, scales, offsets, qhigh, super_scales = (getattr(module, f) for f in TENSOR_FIELDS)
    return QuantWeight(kind, qweight, scales, offsets, group_size, in_features, out_features, qhigh, super_scales)


# ---- packing -------------------------------------------------------------------------------------------------


def concat_rows(parts: list[QuantWeight]) -> QuantWeight:
    """QuantWeights of the same kind and group size stacked along the outputs (every layout here keeps its
    scales per output row, so row blocks concatenate as they are): merged projections, chunked quantization."""
    first = parts[0]
    assert all(
        p.kind == first.kind and p.group_size == first.group_size and p.in_features == first.in_features for p in parts
    ), "concat_rows needs one kind, group size and input width"

    def cat(field: str) -> torch.Tensor | None:
        return None if getattr(first, field) is None else torch.cat([getattr(p, field) for p in parts], dim=0)

    return QuantWeight(
        first.kind,
        cat("qweight"),
        cat("scales"),
        cat("offsets"),
        first.group_size,
        first.in_features,
        sum(p.out_features for p in parts),
        cat("qhigh"),
        cat("super_scales"),
    )


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(N, K) integers in 0..15 -> (N, K // 2) uint8, k = 2j low nibble, k = 2j + 1 high nibble."""
    assert q.shape[-1] % 2 == 0
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K // 2) uint8 -> (N, K) uint8 in 0..15 (inverse of pack_int4)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_q6_high(high: torch.Tensor) -> torch.Tensor:
    """(N, K) integers in 0..3 (the 6-bit values' high bits) -> qhigh uint8 (N, K // 4) in q6's order: byte
    16c + b holds weights 64c + 2b + o + 32h (o, h in 0..1) in bits 2 (2h + o) and up."""
    n, k = high.shape
    assert k % 64 == 0, "q6 packs its high bits in chunks of 64 weights"
    fields = high.to(torch.uint8).reshape(n, k // 64, 2, 16, 2)  # (N, chunk c, half h, byte b, odd o)
    fields = fields.permute(0, 1, 3, 2, 4).reshape(n, k // 64, 16, 4)  # (..., b, field 2h + o)
    return (fields[..., 0] | fields[..., 1] << 2 | fields[..., 2] << 4 | fields[..., 3] << 6).reshape(n, k // 4)


def unpack_q6_high(qhigh: torch.Tensor) -> torch.Tensor:
    """qhigh uint8 (N, K // 4) -> (N, K) uint8 in 0..3 (inverse of pack_q6_high)."""
    n, k = qhigh.shape[0], qhigh.shape[1] * 4
    q = qhigh.reshape(n, k // 64, 16)
    # shifts by Python ints, no shift tensor: a tensor made from a list is a host-to-device copy, which a CUDA graph
    # capture refuses (a q6 embedding's lookup, quant_embedding.py, runs inside the decode step's graph)
    fields = torch.stack([(q >> s) & 3 for s in (0, 2, 4, 6)], dim=-1)  # (N, c, b, field 2h + o)
    return fields.reshape(n, k // 64, 16, 2, 2).permute(0, 1, 3, 2, 4).reshape(n, k)


# ---- dequantize (the reference semantics of each layout) -----------------------------------------------------


def _per_column(t: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K // G) -> (N, K): each group's value repeated over its G columns."""
    return t.float().repeat_interleave(group_size, dim=1)


def dequantize(w: QuantWeight) -> torch.Tensor:
    """The float32 (N, K) weight that `w` stands for."""
    if w.kind == "int8":
        return w.qweight.float() * _per_column(w.scales, w.group_size)
    if w.kind == "int4":
        q = unpack_int4(w.qweight).float()
        return q * _per_column(w.scales, w.group_size) + _per_column(w.offsets, w.group_size)
    if w.kind == "fp8":
        return w.qweight.float() * _per_column(w.scales, w.group_size)
    if w.kind == "q6":
        return _dequantize_q6(w)
    raise ValueError(f"unknown quantized weight kind {w.kind!r}")


def _dequantize_q6(w: QuantWeight) -> torch.Tensor:
    """q6 -> float32 (N, K), exactly Q6_K's weights: d * sc * (q - 32) needs at most 11 + 7 + 5 significant bits,
    so float32 holds it exactly whatever the order of the products (gguf's dequantizer multiplies d * sc first)."""
    q = unpack_int4(w.qweight).to(torch.int16) | (unpack_q6_high(w.qhigh).to(torch.int16) << 4)
    sub = w.scales.to(torch.int16).repeat_interleave(16, dim=1) * (q - 32)  # exact: |sc (q - 32)| <= 4096
    return sub.float() * _per_column(w.super_scales, 256)


def quant_matmul_reference(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (..., K) -> (..., N) in x's dtype; math in float32 (the slow, obvious version)."""
    out = x.float() @ dequantize(w).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def quant_matmul_torch(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch path for CPU: dequantize to x's dtype, one F.linear (a transient dense copy per call)."""
    dense = dequantize(w).to(x.dtype)
    return torch.nn.functional.linear(x, dense, None if bias is None else bias.to(x.dtype))


# ---- round-to-nearest quantizers (fp16/bf16/fp32 dense weight -> layout) --------------------------------------


def quantize_int8(
    weight: torch.Tensor,
    group_size: int | None = None,
    scale_dtype: torch.dtype | None = None,
    scale_grid: torch.dtype | None = None,
) -> QuantWeight:
    """Symmetric round-to-nearest int8; per output channel when group_size is None.  `scale_grid`: round the
    scales to that dtype before the values are rounded (a kernel that holds its scales in bf16 then runs each
    group with the scale its integers were chosen for; the largest value may land on 127.25: clamped to 127)."""
    n, k = weight.shape
    g = k if group_size is None else group_size
    _check_group(k, g)
    wf = weight.float().reshape(n, k // g, g)
    scales = wf.abs().amax(dim=-1).clamp(min=1e-10) / 127.0  # (N, K // G)
    if scale_grid is not None:
        scales = scales.to(scale_grid).float()
    q = torch.round(wf / scales[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return QuantWeight("int8", q, scales.to(scale_dtype or weight.dtype), None, g, k, n)


def quantize_int4(
    weight: torch.Tensor,
    group_size: int = 128,
    scale_dtype: torch.dtype | None = None,
    clip_ratios: tuple[float, ...] = (1.0,),
) -> QuantWeight:
    """Asymmetric round-to-nearest int4 per group: offset = group min, scale = (max - min) / 15.

    clip_ratios: shrink each group's [min, max] by these factors and keep, per group, the one with the least
    squared weight error (outliers clipped so the other 127 values get a finer grid); (1.0,) is plain RTN.
    """
    n, k = weight.shape
    _check_group(k, group_size)
    if group_size % 2:
        raise ValueError(f"int4 group size must be even, got {group_size}")
    sdt = scale_dtype or weight.dtype
    wf = weight.float().reshape(n, k // group_size, group_size)
    lo0, hi0 = wf.amin(dim=-1), wf.amax(dim=-1)
    best_err = best_q = best_s = best_o = None
    for ratio in clip_ratios:
        # Round the scale/offset to their storage dtype first so q is chosen against what the kernel sees.
        lo, hi = lo0 * ratio, hi0 * ratio
        scales = ((hi - lo) / 15.0).clamp(min=1e-10).to(sdt).float()
        offsets = lo.to(sdt).float()
        q = torch.round((wf - offsets[..., None]) / scales[..., None]).clamp(0, 15)
        err = (q * scales[..., None] + offsets[..., None] - wf).pow(2).sum(dim=-1)  # (N, K // G)
        if best_err is None:
            best_err, best_q, best_s, best_o = err, q, scales, offsets
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_q = torch.where(better[..., None], q, best_q)
        best_s, best_o = torch.where(better, scales, best_s), torch.where(better, offsets, best_o)
    return QuantWeight("int4", pack_int4(best_q.reshape(n, k)), best_s.to(sdt), best_o.to(sdt), group_size, k, n)


def quantize_fp8(weight: torch.Tensor, scale_dtype: torch.dtype | None = None) -> QuantWeight:
    """Per-output-channel float8_e4m3fn: scale = absmax / 448."""
    n, k = weight.shape
    wf = weight.float()
    scales = wf.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / FP8_E4M3_MAX  # (N, 1)
    q = (wf / scales).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return QuantWeight("fp8", q, scales.to(scale_dtype or weight.dtype), None, k, k, n)


def fp8_supported(device: torch.device) -> bool:
    """FP8 e4m3 Triton kernels need compute capability 8.9 or newer (Ada, Hopper, Blackwell)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _check_group(k: int, group_size: int) -> None:
    if group_size <= 0 or k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the group size {group_size}")
