"""W8A8 matmul on CPU for a few rows: int8 weights per output channel, activations quantized per row on the fly,
integer dot products through fbgemm (`quantized::linear_dynamic`, VNNI where the CPU has it).

Math.  Weight: w[n, k] = qweight[n, k] * scales[n], qweight int8 in [-127, 127].  Each activation row x_i is split
into PASSES integer vectors by residual quantization: r_1 = x_i; for p = 1..PASSES, s_p = max|r_p| / 63,
a_p = round(r_p / s_p) (integers in [-63, 63]), r_{p+1} = r_p - s_p a_p.  Then

    out[i, n] = scales[n] * sum_p s_p * (a_p . qweight[n])

where every a_p . qweight[n] is an exact int32 dot product.  One pass (7-bit activations) lost too much on the
starter's final hidden states, whose few outlier channels set the row's scale (head ΔPPL +0.41 of 17.18, top-1
agreement 0.90); two passes carry ~13 bits and were as good as float activations (ΔPPL -0.006, top-1 0.979,
mean KL 0.0008 against a float32 head; the bf16 dense head: -0.012, 0.978, 0.0003).  The second pass costs one
more row of the same weight read, which is what bounds a few-row call.

Why the pad row.  fbgemm's dynamic op quantizes its whole input with one scale and zero point chosen from the
input's min and max, so a row's result would depend on the other rows of the call.  The integer rows above go in
with one extra row holding -64 and 63: min and max are then always -64 and 63, fbgemm picks scale 1.0 and zero
point 64 (its 7-bit "reduce_range" grid, 0..127, the one that cannot saturate int16 pair sums on CPUs without
VNNI), every integer passes through unchanged, and each output is float(exact int32) * scales[n].  A row gets
the same bits alone and among others; `batch_invariant` checks that on the machine before the engine relies on it.

Measured on the 2-core Zen 4 machine (loaded), the starter's 49152 x 576 head at one thread, CPU time of one
call: this 1.1-1.3 ms; the bf16 dense head 6.9 ms (`linear`) / 11 ms (`mv`); two int4 halves of its Q8_0 blocks
3.5 ms.  Bytes: 1 per weight + 4 per output row.  For the projections of a decode step torch's int4 kernel stays
faster once the 30 layers' weights no longer fit the cache (int8 reads twice the bytes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

ACT_LEVELS = 63  # |a_p| <= 63: with the pad row's -64 the input spans exactly fbgemm's 7-bit grid
PASSES = 2


@dataclass
class Int8RowsWeight:
    """A (N, K) weight ready for `int8_rows_matmul`: the plain tensors (what a cache on disk keeps) and fbgemm's
    packed copy made from them by `pack_int8_rows` (cheap: ~0.25 s for the starter's head)."""

    qweight: torch.Tensor | None  # (N, K) int8; None once packed and no longer needed (the packed copy holds it)
    scales: torch.Tensor  # (N,) float32
    packed: Any  # torch.ops.quantized.linear_prepack's result
    in_features: int
    out_features: int

    @property
    def nbytes(self) -> int:
        q = 0 if self.qweight is None else self.qweight.numel()
        return self.in_features * self.out_features + 4 * self.out_features + q


def available() -> bool:
    """Whether this torch has fbgemm's dynamic quantized linear on the CPU."""
    ops = torch.ops.quantized
    return (
        hasattr(ops, "linear_dynamic")
        and hasattr(ops, "linear_prepack")
        and "fbgemm" in torch.backends.quantized.supported_engines
    )


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest per output channel: (N, K) float -> (int8 (N, K), float32 (N,) scales)."""
    wf = weight.float()
    scales = wf.abs().amax(dim=1).clamp_min(1e-30) / 127.0
    q = torch.round(wf / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def pack_int8_rows(qweight: torch.Tensor, scales: torch.Tensor) -> Int8RowsWeight:
    """fbgemm's packed copy of (qweight, scales); ValueError on shapes it cannot take."""
    n, k = qweight.shape
    if qweight.dtype != torch.int8 or scales.shape != (n,):
        raise ValueError(
            f"an int8 rows weight is int8 (N, K) with (N,) scales, got {qweight.dtype} and {tuple(scales.shape)} scales"
        )
    zeros = torch.zeros(n, dtype=torch.long)
    with _fbgemm(), warnings.catch_warnings():
        # torch 2.13 warns that quantized tensor types will go; `available` and the caller's fallback cover the
        # day they do, and the warning would otherwise print at every CPU load
        warnings.simplefilter("ignore", UserWarning)
        qt = torch._make_per_channel_quantized_tensor(qweight, scales.double(), zeros, 0)
        packed = torch.ops.quantized.linear_prepack(qt, None)
    return Int8RowsWeight(qweight, scales.float(), packed, k, n)


class _fbgemm:
    """The quantized engine set to fbgemm for a prepack (the default "x86" engine may pick oneDNN, whose dynamic
    op rounds differently; the pad row's reasoning is fbgemm's)."""

    def __enter__(self) -> None:
        self.before = torch.backends.quantized.engine
        torch.backends.quantized.engine = "fbgemm"

    def __exit__(self, *exc: object) -> None:
        torch.backends.quantized.engine = self.before


def split_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) -> integer-valued float32 (PASSES * M, K) in [-63, 63] (pass-major) and (PASSES * M, 1) scales."""
    rem = x.float()
    parts, scales = [], []
    for p in range(PASSES):
        s = rem.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30).div_(ACT_LEVELS)
        a = torch.round(rem / s)
        parts.append(a)
        scales.append(s)
        if p + 1 < PASSES:
            rem = rem - a * s
    return torch.cat(parts), torch.cat(scales)


def int8_rows_matmul(x: torch.Tensor, w: Int8RowsWeight) -> torch.Tensor:
    """x: (M, K) float -> (M, N) float32, as the module docstring says."""
    m = x.shape[0]
    a, s = split_rows(x)
    pad = a.new_zeros(1, w.in_features)
    pad[0, 0], pad[0, -1] = -(ACT_LEVELS + 1), ACT_LEVELS
    y = torch.ops.quantized.linear_dynamic(torch.cat([a, pad]), w.packed, True)  # (PASSES * M + 1, N)
    out = y[:m] * s[:m]
    for p in range(1, PASSES):
        out.add_(y[p * m : (p + 1) * m] * s[p * m : (p + 1) * m])
    return out


def int8_rows_matmul_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The same math in float64, one obvious matmul per pass: (M, K) -> (M, N) float32."""
    a, s = split_rows(x)
    m = x.shape[0]
    dots = a.double() @ qweight.double().t()  # exact: |sums| < 2**53
    out = sum(dots[p * m : (p + 1) * m] * s[p * m : (p + 1) * m].double() for p in range(PASSES))
    return (out * scales.double()).float()


def batch_invariant(w: Int8RowsWeight, rows: int = 5, seed: int = 0) -> str | None:
    """None when, on this machine, rows computed alone and together give the same bits and match the reference;
    else why not (then the caller keeps its dense path).  Needs w.qweight.  A few ms for a 49152-row head."""
    if w.qweight is None:
        raise ValueError("batch_invariant needs the weight's int8 tensor")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.in_features, generator=g) * torch.rand(rows, 1, generator=g) * 8
    x[:, 3] *= 30  # an outlier channel, as hidden states have
    together = int8_rows_matmul(x, w)
    for i in range(rows):
        if not torch.equal(int8_rows_matmul(x[i : i + 1], w), together[i : i + 1]):
            return f"row {i} alone differs from the same row among {rows}"
    want = int8_rows_matmul_reference(x, w.qweight, w.scales)
    err = float((together - want).abs().max())
    limit = 1e-5 * max(1.0, float(want.abs().max()))
    if not err <= limit:
        return f"max error {err:.3g} against the integer reference (limit {limit:.3g})"
    return None
