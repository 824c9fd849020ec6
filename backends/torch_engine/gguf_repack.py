"""GGUF projection blocks re-laid into the kernels' int4 / int8 layouts (kernels/quant_matmul.py), group size 32.

`repack_gguf(raw_blocks, ggml_type, ...)` takes a weight's bytes exactly as the file stores them and runs on
whatever device they are on; no dense copy of the weight is made.  What each type becomes:

- Q4_0, Q4_1, Q4_K -> int4 (w = q * scale + offset per group of 32; Q4_K's 256-value blocks are 8 groups with
  scales d * sc and offsets -dmin * m): exactly the file's weights.
- Q8_0 -> int8 (w = q * d per group of 32): exactly the file's weights.
- Q5_0 -> int8: w = d * (q5 - 16) with q5 in 0..31 is an int8 value in -16..15 with the block's scale d,
  exactly the file's weights.  In 8 bits instead of 5.5: torch's CPU kernels read group-wise int8 as two int4
  halves (kernels/quant_matmul_cpu.py), and no kernel of ours reads 5-bit values; still half of bf16.
- Q6_K -> on a GPU, "q6" (gguf_q6.py): the file's blocks bit for bit at 6.5625 bits, read by Triton kernels
  of their own.  On the CPU (no kernel of ours reads q6 there) int8 per group of 32, requantized: Q6_K scales
  every 16 values (d * sc, sc int8) and the CPU's kernels take no groups of 16, so the exact values are rebuilt
  with integer ops and rounded to the nearest of 255 levels per 32 (scale max|w| / 127, rounded to bf16 first
  since the CPU kernel holds its scales in bf16).  The added error is at most half a level, about a quarter of
  Q6_K's own rounding step (its 64 levels per 16 values), so these are not bit for bit the weights llama.cpp
  runs.  Measured on Gemma 3 270M's Q6_K down projections: see the README ("Which GGUF types the torch engine
  keeps quantized").
- The other K-quants and legacy types (Q5_1, Q5_K, Q3_K, Q2_K) and the IQ4/IQ3/IQ2 types -> int8 per 32 the
  same way, from the exact values gguf's own dequantizer gives (`REQUANTIZED`): within half an int8 level,
  a small fraction of their own step; 8.5 bits a weight where the file has 2-6, but half of the bf16 a
  dequantized projection would take (the CPU's kernels read no narrower group-wise format).

Other types (IQ1_S/IQ1_M, the ternary TQ and the MXFP4/NVFP4 ones) are dequantized by the loader to the
compute dtype.  A merged projection whose shards repack to int4 and int8 keeps each shard at its own kind
(`merge_kept`: a SplitLinear of the parts).
backends/weight_map.REPACK_KIND and repacked_params are the same rules for the planner's arithmetic.
"""

from __future__ import annotations

import gguf.quants
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from backends.torch_engine.gguf_q6 import repack_q6k
from kernels.quant_matmul import QuantWeight, concat_rows, pack_int4, quantize_int8

# requantized to int8 per 32 from gguf's own dequantizer's exact values (module docstring)
REQUANTIZED = ("Q5_1", "Q5_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S")
# bytes per block, values per block, for every type repack_gguf takes
GGUF_BLOCKS = {
    name: (GGML_QUANT_SIZES[GGMLQuantizationType[name]][1], GGML_QUANT_SIZES[GGMLQuantizationType[name]][0])
    for name in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_0", "Q6_K", *REQUANTIZED)
}
GROUP = 32


def repack_gguf(
    raw: torch.Tensor,
    ggml_type: str,
    out_features: int,
    in_features: int,
    scale_dtype: torch.dtype = torch.float16,
    q6: bool = False,
) -> QuantWeight:
    """GGUF blocks of an (out_features, in_features) weight -> QuantWeight (int4 or int8, group size 32; with
    `q6`, Q6_K as it is: kind "q6", gguf_q6.repack_q6k, for the GPU's kernels).

    raw: uint8, (out_features, bytes_per_row) or flat, exactly as stored in the file (gguf's reader gives it).
    Only integer ops unpack the values; scales come from the blocks' fp16 fields (Q4_K: d * sc and dmin * m).
    """
    if ggml_type not in GGUF_BLOCKS:
        raise ValueError(f"cannot repack GGUF {ggml_type}; supported: {', '.join(GGUF_BLOCKS)}")
    block_bytes, block_values = GGUF_BLOCKS[ggml_type]
    if in_features % block_values:
        raise ValueError(f"{ggml_type} rows must be a multiple of {block_values} values, got {in_features}")
    n_blocks = in_features // block_values
    expected = out_features * n_blocks * block_bytes
    if raw.dtype != torch.uint8 or raw.numel() != expected:
        raise ValueError(
            f"{ggml_type} weight {out_features}x{in_features} needs {expected} uint8 bytes, "
            f"got {raw.numel()} {raw.dtype}"
        )
    blocks = raw.reshape(out_features * n_blocks, block_bytes)
    if q6 and ggml_type == "Q6_K":
        return repack_q6k(blocks, out_features, in_features)
    groups = (out_features, in_features // GROUP)
    if ggml_type == "Q8_0":
        d = _f16(blocks[:, 0:2])
        q = blocks[:, 2:].contiguous().view(torch.int8).reshape(out_features, in_features)
        return QuantWeight("int8", q, d.reshape(groups).to(scale_dtype), None, GROUP, in_features, out_features)
    if ggml_type == "Q5_0":
        d = _f16(blocks[:, 0:2])
        q = (q5_0_values(blocks) - 16).to(torch.int8).reshape(out_features, in_features)
        return QuantWeight("int8", q, d.reshape(groups).to(scale_dtype), None, GROUP, in_features, out_features)
    if ggml_type == "Q6_K":
        w = q6_k_weights(blocks).reshape(out_features, in_features)
        return requantize_int8(w, scale_dtype)
    if ggml_type in REQUANTIZED:
        values = gguf.quants.dequantize(blocks.reshape(out_features, -1).cpu().numpy(), GGMLQuantizationType[ggml_type])
        w = torch.from_numpy(values.reshape(out_features, in_features)).to(blocks.device)
        return requantize_int8(w, scale_dtype)
    if ggml_type in ("Q4_0", "Q4_1"):
        d = _f16(blocks[:, 0:2]).float()
        if ggml_type == "Q4_0":
            offsets, qs = -8.0 * d, blocks[:, 2:]
        else:
            offsets, qs = _f16(blocks[:, 2:4]).float(), blocks[:, 4:]
        values = _relayout_nibbles(qs, 16)  # (N * n_blocks, 32)
        scales = d
    else:  # Q4_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes
        d = _f16(blocks[:, 0:2]).float()[:, None]  # (blocks, 1)
        dmin = _f16(blocks[:, 2:4]).float()[:, None]
        sc, mn = _q4k_scale_min(blocks[:, 4:16])
        scales = (d * sc.float()).reshape(-1)
        offsets = (-dmin * mn.float()).reshape(-1)
        values = _relayout_nibbles(blocks[:, 16:], 32)  # (N * n_blocks, 256)
    q = pack_int4(values.reshape(out_features, in_features))
    return QuantWeight(
        "int4",
        q,
        scales.reshape(groups).to(scale_dtype),
        offsets.reshape(groups).to(scale_dtype),
        GROUP,
        in_features,
        out_features,
    )


def q5_0_values(blocks: torch.Tensor) -> torch.Tensor:
    """(blocks, 22) Q5_0 -> the 5-bit values (blocks, 32) in 0..31 as int16: value j's low 4 bits are nibble j
    of the 16 `qs` bytes (low nibbles first), its 5th bit is bit j of the little-endian uint32 `qh`."""
    low = _relayout_nibbles(blocks[:, 6:22], 16).to(torch.int16)
    shifts = torch.arange(8, dtype=torch.uint8, device=blocks.device)
    high = ((blocks[:, 2:6, None] >> shifts) & 1).reshape(-1, 32).to(torch.int16)  # byte i bit b -> value 8i+b
    return low | (high << 4)


def q6_k_weights(blocks: torch.Tensor) -> torch.Tensor:
    """(blocks, 210) Q6_K -> float32 weights (blocks, 256): w = d * sc[p // 16] * (q - 32), q 6 bits.

    Layout per block: ql (128 bytes: low 4 bits), qh (64: high 2 bits), 16 int8 scales, fp16 d.  Each half of
    128 values takes 64 ql bytes and 32 qh bytes: value 32j + l (j 0..3, l 0..31) has the low nibble (j odd:
    of byte l + 32; j >= 2: the high nibble) and bits 2j, 2j + 1 of qh byte l."""
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-1).to(torch.int16)  # (n, 2, 128): j = 0, 1, 2, 3 in order
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)
    high = ((qh >> shifts) & 3).reshape(n, 2, 128).to(torch.int16)
    q = ((low | (high << 4)) - 32).reshape(n, 16, 16)
    sc = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.int16)  # (n, 16)
    d = _f16(blocks[:, 208:210]).float()
    return (d[:, None, None] * (sc[:, :, None] * q).float()).reshape(n, 256)  # sc * q is exact in int16


def merge_kept(parts: list[QuantWeight]) -> QuantWeight | list[QuantWeight]:
    """The shards of a merged projection (Q/K/V, gate/up) as one QuantWeight when they share a kind and group
    size (stacked as they are), else as parts each kept at its own kind, neighbours of one kind stacked into one
    part: the loader holds them as a SplitLinear (split_linear.py), one QuantLinear a part.  A Q4_K_M layer's
    Q4_K Q and K beside its Q6_K V are thus [Q and K int4, V int8], where they used to be requantized to int8
    together.  weight_map.repacked_params is the same rule for the planner."""
    runs: list[list[QuantWeight]] = []
    for p in parts:
        if runs and (p.kind, p.group_size) == (runs[-1][0].kind, runs[-1][0].group_size):
            runs[-1].append(p)
        else:
            runs.append([p])
    merged = [run[0] if len(run) == 1 else concat_rows(run) for run in runs]
    return merged[0] if len(merged) == 1 else merged


def requantize_int8(w: torch.Tensor, scale_dtype: torch.dtype) -> QuantWeight:
    """Round-to-nearest int8 per group of 32 with the scales on the bf16 grid (the CPU kernel holds its scales
    in bf16): kernels/quant_matmul.quantize_int8 with scale_grid."""
    return quantize_int8(w, GROUP, scale_dtype, scale_grid=torch.bfloat16)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """(blocks, 2) uint8 little-endian -> (blocks,) float16."""
    return raw.contiguous().view(torch.float16).reshape(-1)


def _relayout_nibbles(qs: torch.Tensor, run: int) -> torch.Tensor:
    """GGUF packs `run` consecutive values in low nibbles, then the next `run` in high nibbles, per 2*run chunk:
    (rows, bytes) uint8 -> values (rows, 2 * bytes) uint8 in order."""
    rows = qs.shape[0]
    chunks = qs.reshape(rows, -1, run)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=-1).reshape(rows, -1)


def _q4k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, 12) uint8 -> 6-bit scales and mins, each (blocks, 8): bytes 0-3 low 6 bits = sc[0:4],
    4-7 = mn[0:4]; sc[4:8] = low nibble of bytes 8-11 | top 2 bits of bytes 0-3 << 4; mn[4:8] likewise with
    the high nibbles and bytes 4-7."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn
