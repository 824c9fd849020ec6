"""GGUF Q6_K blocks re-laid, bit for bit, into kernels/quant_matmul.py's "q6" layout (6.5625 bits a weight).

Why beside gguf_repack.py's requantization to int8 (8.5 bits, within half an int8 level of the file's weights):
on CUDA, kernels/q6_gemv_triton.py reads Q6_K's own information, so a Q4_K_M model's Q6_K layers (attn_v and
ffn_down in half the layers, the output head) keep llama.cpp's exact weights in 23 % fewer bytes.

A Q6_K block is 210 bytes for 256 weights: ql (128 bytes, the low 4 bits), qh (64 bytes, the high 2 bits), 16
int8 sub-scales, then d (float16); w = d * sc[p // 16] * (q - 32).  Each half of 128 values takes 64 ql bytes
and 32 qh bytes: value 32j + l (j 0..3, l 0..31) of a half has its low nibble in ql byte l + 32 (j % 2) (the high
nibble when j >= 2) and its high bits in bits 2j, 2j + 1 of qh byte l.  Only integer ops move the values; the
sub-scales and d are the file's bytes, reinterpreted.
"""

from __future__ import annotations

import torch

from backends.errors import ModelFormatError
from kernels.quant_matmul import QuantWeight, pack_int4, pack_q6_high

BLOCK_BYTES, BLOCK_VALUES = 210, 256  # bytes and values a block (gguf's GGML_QUANT_SIZES[Q6_K] is (256, 210))


def q6_k_values(blocks: torch.Tensor) -> torch.Tensor:
    """(blocks, 210) uint8 Q6_K -> the 6-bit values q (blocks, 256) as uint8 in 0..63, in weight order."""
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-1)  # (n, half, 128): j = 0, 1, 2, 3 in order, 32 values each
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)
    high = ((qh >> shifts) & 3).reshape(n, 2, 128)
    return (low | (high << 4)).reshape(n, 256)


def repack_q6k(blocks: torch.Tensor, rows: int, cols: int) -> QuantWeight:
    """Q6_K blocks of a (rows, cols) weight -> QuantWeight kind "q6", on the blocks' device.

    blocks: uint8, (rows * cols // 256, 210), (rows, bytes per row) or flat, exactly as the file stores them (a
    row's blocks one after another).  dequantize(result) equals gguf's own dequantization bit for bit."""
    if cols % BLOCK_VALUES:
        raise ModelFormatError(f"Q6_K rows must be a multiple of {BLOCK_VALUES} values, got {cols}")
    n_blocks = rows * (cols // BLOCK_VALUES)
    if blocks.dtype != torch.uint8 or blocks.numel() != n_blocks * BLOCK_BYTES:
        raise ModelFormatError(
            f"Q6_K weight {rows}x{cols} needs {n_blocks * BLOCK_BYTES} uint8 bytes ({n_blocks} blocks of "
            f"{BLOCK_BYTES}), got {blocks.numel()} {blocks.dtype}: the file is truncated or the shape is wrong"
        )
    blocks = blocks.reshape(n_blocks, BLOCK_BYTES)
    q = q6_k_values(blocks).reshape(rows, cols)
    sub_scales = blocks[:, 192:208].contiguous().view(torch.int8).reshape(rows, cols // 16)
    d = blocks[:, 208:210].contiguous().view(torch.float16).reshape(rows, cols // BLOCK_VALUES)
    return QuantWeight(
        "q6",
        pack_int4(q & 0x0F),
        sub_scales,
        None,
        16,
        cols,
        rows,
        qhigh=pack_q6_high(q >> 4),
        super_scales=d,
    )
