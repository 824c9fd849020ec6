"""GPTQ and AWQ packed weights re-laid into the kernels' int4 / int8 layouts (kernels/quant_matmul.py), with integer
ops only: no weight passes through 16 bits, and the result is exactly the weights the reference kernels compute.

Both formats dequantize as w = scale * (q - zero) per group of input features (AutoGPTQ's QuantLinear.pack and
AutoAWQ's WQLinear_GEMM.from_linear round (w + zero * scale) / scale), so the int4 layout's float offset is
-scale * zero (exact in float32: an fp16 scale times a zero of at most 5 bits).  The packings (K inputs,
N outputs, int32 words, lowest bits first):

- GPTQ qweight (K * bits / 32, N): word [r, n] holds inputs 32 / bits * r + i of output n in bits i * bits
  upwards.  Read as little-endian bytes, a 4-bit word's byte b holds inputs 8r + 2b (low nibble) and 8r + 2b + 1
  (high): the int4 layout's byte 4r + b of row n, so a transpose of bytes re-lays it with no unpacking.  8-bit:
  byte b is input 4r + b, an int8 value once 128 is taken off (symmetric zero points only: the int8 layout
  has no offset).  qzeros (G, N * bits / 32): output n's zero point in word n * bits / 32, the same order; the
  classic "gptq" checkpoint format stores zero - 1 (AutoGPTQ's `zeros -= 1` before packing; its kernels add 1
  back, and so does this), "gptq_v2" the zero itself.  scales (G, N).
- act-order (desc_act): g_idx (K,) names each input's group, not in order.  The inputs are permuted once here
  so that the groups run contiguously (perm = a stable argsort of g_idx) and the layer permutes its activations
  the same way (QuantLinear's input_perm): x[perm] @ W[:, perm]^T = x @ W^T.  A g_idx that is k // G (desc_act
  with static groups, or none at all) needs no permutation.
- AWQ (GEMM) qweight (K, N / 8): word [k, c] holds outputs 8c + AWQ_ORDER[i] in nibble i (AutoAWQ's order_map);
  qzeros (G, N / 8) the same way, zero points as they are.  scales (G, N).

One group per output channel (group size -1) becomes groups of 128 (or 64 / 32) with the scale repeated, the
same weights in a group size torch's CPU int4 kernel and the Triton ones take.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from backends.errors import ModelFormatError
from backends.model_limits import HINT
from backends.quant_config import PACKED, REGROUP_SIZES, CheckpointQuant, PackedModule
from kernels.quant_matmul import QuantWeight, pack_int4, unpack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds output column AWQ_ORDER[i] of its 8
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output column c of the 8 sits in nibble AWQ_REVERSE_ORDER[c]
INPUT_PERM = ".input_perm"  # packed_weights yields a module's act-order permutation under its prefix + this


def _le_bytes(words: torch.Tensor) -> torch.Tensor:
    """(R, C) int32 -> (R, C, 4) uint8, byte 0 the lowest bits (safetensors stores little-endian, and so does
    every CPU torch runs on)."""
    return words.contiguous().view(torch.uint8).reshape(*words.shape, 4)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """(R, C) int32 -> (R, C * 8) uint8 in 0..15, nibble i of word c at column 8c + i."""
    b = _le_bytes(words)
    return torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(words.shape[0], -1)


def _zeros(qzeros: torch.Tensor, bits: int, zero_add: int) -> torch.Tensor:
    """(G, N * bits / 32) packed zero points in natural output order -> (G, N) int16."""
    if bits == 4:
        z = _nibbles(qzeros)
    else:
        z = _le_bytes(qzeros).reshape(qzeros.shape[0], -1)
    return z.to(torch.int16) + zero_add


def _int4(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int, scale_dtype: torch.dtype
) -> QuantWeight:
    """(N, K // 2) packed values, (G, N) scales and zero points -> the int4 QuantWeight (w = q * s - s * z)."""
    n, k = q.shape[0], q.shape[1] * 2
    s = scales.t().float()  # (N, G)
    offsets = -(s * zeros.t().float())
    if group == k and (fits := [g for g in REGROUP_SIZES if k % g == 0]):
        reps, group = k // fits[0], fits[0]
        s, offsets = s.repeat_interleave(reps, dim=1), offsets.repeat_interleave(reps, dim=1)
    return QuantWeight("int4", q.contiguous(), s.to(scale_dtype), offsets.to(scale_dtype), group, k, n)


def input_permutation(g_idx: torch.Tensor, group: int, where: str) -> torch.Tensor | None:
    """The input order that makes act-order groups contiguous (None when they already are), checked: every group
    must hold exactly `group` inputs, else the file is not a GPTQ checkpoint (one line, never a wrong answer)."""
    k = g_idx.numel()
    natural = torch.arange(k, dtype=torch.int64) // group
    g = g_idx.to(torch.int64)
    if torch.equal(g, natural):
        return None
    perm = torch.argsort(g, stable=True)
    if not torch.equal(g[perm], natural):
        raise ModelFormatError(f"{where}.g_idx does not put {group} inputs in each of {k // group} groups", HINT)
    return perm


def unpack_gptq(
    tensors: dict[str, torch.Tensor], quant: CheckpointQuant, where: str, scale_dtype: torch.dtype = torch.float32
) -> tuple[QuantWeight, torch.Tensor | None]:
    """One GPTQ module's qweight / qzeros / scales (/ g_idx) -> (QuantWeight, input permutation or None).
    Shapes were checked from the headers (quant_config.packed_modules)."""
    qweight, scales = tensors["qweight"], tensors["scales"]
    rows, n = qweight.shape
    b = _le_bytes(qweight).permute(1, 0, 2).reshape(n, rows * 4)  # (N, K // 2) for 4 bits, (N, K) for 8
    k = rows * 32 // quant.bits
    group = quant.group_for(k)
    zeros = _zeros(tensors["qzeros"], quant.bits, quant.zero_add)
    perm = input_permutation(tensors["g_idx"], group, where) if "g_idx" in tensors else None
    if quant.bits == 8:
        if not bool((zeros == 128).all()):
            raise ModelFormatError(
                f"{where}: GPTQ 8-bit with asymmetric zero points is not supported (hearth's int8 layout has none)",
                "use a symmetric (sym: true) 8-bit checkpoint, a 4-bit one, or a GGUF",
            )
        q8 = (b ^ 0x80).view(torch.int8)  # q - 128
        if perm is not None:
            q8 = q8[:, perm]
        s = scales.t().to(scale_dtype).contiguous()
        return QuantWeight("int8", q8.contiguous(), s, None, group, k, n), perm
    if perm is not None:
        b = pack_int4(unpack_int4(b)[:, perm])
    return _int4(b, scales, zeros, group, scale_dtype), perm


def unpack_awq(
    tensors: dict[str, torch.Tensor], quant: CheckpointQuant, scale_dtype: torch.dtype = torch.float32
) -> QuantWeight:
    """One AWQ GEMM module's qweight / qzeros / scales -> the int4 QuantWeight."""
    reverse = torch.tensor(AWQ_REVERSE_ORDER)
    qweight = tensors["qweight"]
    k, words = qweight.shape
    q = _nibbles(qweight).reshape(k, words, 8)[:, :, reverse].reshape(k, words * 8)  # (K, N) in output order
    qz = tensors["qzeros"]
    zeros = _nibbles(qz).reshape(qz.shape[0], -1, 8)[:, :, reverse].reshape(qz.shape[0], -1).to(torch.int16)
    return _int4(pack_int4(q.t()), tensors["scales"], zeros, quant.group_for(k), scale_dtype)


def packed_weights(
    stream: Iterable[tuple[str, torch.Tensor]],
    quant: CheckpointQuant,
    modules: Iterable[PackedModule],
    scale_dtype: torch.dtype = torch.float32,
) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """A checkpoint's (name, tensor) stream with each quantized module's packed tensors replaced, once all of
    them have been read (a sharded checkpoint may split them over files), by (prefix + ".weight",
    QuantWeight) and, for an act-order module, (prefix + INPUT_PERM, its input permutation).  `modules`:
    quant_config.packed_modules of the same checkpoint (which checked the shapes)."""
    wanted = {m.prefix: {*PACKED, *(("g_idx",) if m.has_g_idx else ())} for m in modules}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in stream:
        prefix, _, part = name.rpartition(".")
        if prefix not in wanted or part not in wanted[prefix]:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if len(parts) < len(wanted[prefix]):
            continue
        del pending[prefix]
        if quant.method == "awq":
            yield prefix + ".weight", unpack_awq(parts, quant, scale_dtype)
            continue
        weight, perm = unpack_gptq(parts, quant, prefix, scale_dtype)
        yield prefix + ".weight", weight
        if perm is not None:
            yield prefix + INPUT_PERM, perm
