"""Triton decode kernel for 1 to 16 rows of "q6" weights: GGUF Q6_K at its own 6.5625 bits (kernels/quant_matmul.py).

out[m, n] = sum_blocks d[n, blk] * sum_{s in blk} sc[n, s] * sum_{k in s} x[m, k] * (q[n, k] - 32)

The reference is kernels/quant_matmul.py's quant_matmul_reference; quant_matmul_triton sends q6 calls of up to
16 rows here.  The design is quant_gemv_triton.py's (read its docstring), for a 6-bit value split in two tensors:

- no MMA: every row is a broadcast product and a sum, so 1 row costs what it reads and 16 rows reuse each decoded
  weight from registers;
- a program step takes a 256-weight block (one d) in four 64-weight quarters; a quarter is three int32 vectors of
  4 words, each a 16-byte load: the nibbles of weights 0-31 (`la`), of weights 32-63 (`lb`) and the high bits of
  all 64 (`hw`).  All three have one shape, so they share one register layout and nothing moves between threads;
- qhigh's order is chosen for this: word w of `hw` holds the high bits of the 8 weights of word w of `la` and of
  `lb`, byte i of it those of nibbles 2i and 2i + 1 of both, so four values at once are
  `(nibbles >> 4o) & 0x0F0F0F0F | (hw shifted by 4 - 2g) & 0x30303030`: a 6-bit value in each byte, for one shift
  of `hw` and one of the nibbles per 16 weights (`_q6_bytes`);
- a byte becomes a float by bit tricks, not a conversion instruction: ORed into the bits of 2**23 it is the float
  2**23 + q, and subtracting 2**23 + 32 gives q - 32 exactly, so the -32 costs nothing (folded, not a
  -32 x sum(x) term); the int8 sub-scales by the sign-extension trick of quant_gemv_triton's int8;
- sub-scales are loaded once per 16 weights (a quarter's four in one int32 word) and d once per 256;
- the grid is rows of N times blocks of K (split K with float32 atomics) so that even a small N fills every SM;
- one row has a kernel of its own (`_q6_row_kernel`, one warp a program, x read in the weights' own layout) so it
  compiles to 128-bit loads and no shared memory (tests/kernels/test_q6_gemv.py checks sm_86, sm_89 and sm_90).

Layout requirements: in_features a multiple of 256, every tensor contiguous along K.  `supports(w, m)` says
whether a call qualifies.  GPU tiles are untuned (no GPU measured them yet): gpu_blocks holds the guesses.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_gemv_triton import sm_count, split_k_for, split_k_output
from kernels.quant_matmul import QuantWeight

BLOCK = 256  # weights per d (a Q6_K block)
MAX_ROWS = 16  # decode rows this kernel takes; more go to kernels/q6_matmul_triton.py


@triton.jit
def _q6_bytes(la, lb, hw, G: tl.constexpr):
    """Group G of a quarter's words as int32s whose bytes are 6-bit values (bits 6-7 zero): G = 2h + o takes the
    nibbles 2i + o (byte i) of `la` (h = 0) or `lb` (h = 1), and their high bits from bits 2G, 2G + 1 of each
    byte of `hw`, moved to bits 4-5 (kernels/quant_matmul.py's qhigh order)."""
    if G == 0:
        q = (la & 0x0F0F0F0F) | ((hw << 4) & 0x30303030)
    elif G == 1:
        q = ((la >> 4) & 0x0F0F0F0F) | ((hw << 2) & 0x30303030)
    elif G == 2:
        q = (lb & 0x0F0F0F0F) | (hw & 0x30303030)
    else:
        q = ((lb >> 4) & 0x0F0F0F0F) | ((hw >> 2) & 0x30303030)
    return q


@triton.jit
def value_at(q, i: tl.constexpr):
    """Byte i of each int32 as the float q - 32: ORed into the bits of 2**23 a byte is the float 2**23 + q exactly,
    and 2**23 + 32 = 8388640 comes off in one subtraction."""
    return (((q >> (8 * i)) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388640.0


@triton.jit
def _sub_scale(sw, b: tl.constexpr):
    """Signed byte b of each int32 (a quarter's four int8 sub-scales) as float32: sign-extended by shifts, added
    to the bits of 1.5 * 2**23, minus 1.5 * 2**23 (quant_gemv_triton's int8 trick)."""
    return (((sw << (24 - 8 * b)) >> 24) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _row_partials(x_ptrs, mask, la, lb, hw):
    """One quarter at one row: sum x * (q - 32) per word of each half, (BLOCK_N, BLOCK_C, 4) each.  x_ptrs points
    at x of each word's first weight (8 w of the quarter), in the weights' layout."""
    part_a = tl.zeros(la.shape, dtype=tl.float32)
    part_b = tl.zeros(la.shape, dtype=tl.float32)
    for g in tl.static_range(4):
        q = _q6_bytes(la, lb, hw, g)
        for i in tl.static_range(4):
            # byte i of group g = 2h + o: weight 32 h + 8 w + 2 i + o of the quarter
            xp = tl.load(x_ptrs + (32 * (g // 2) + 2 * i + g % 2), mask=mask, other=0.0).to(tl.float32)
            if g < 2:
                part_a += xp * value_at(q, i)
            else:
                part_b += xp * value_at(q, i)
    return part_a, part_b


@triton.jit
def _rows_partials(x_ptrs, mask, la, lb, hw, BLOCK_M: tl.constexpr):
    """_row_partials for BLOCK_M rows: x_ptrs (BLOCK_M, BLOCK_C, 4), the partials (BLOCK_M, BLOCK_N, BLOCK_C, 4)
    (every decoded weight meets every row's x)."""
    part_a = tl.zeros((BLOCK_M, la.shape[0], la.shape[1], 4), dtype=tl.float32)
    part_b = tl.zeros((BLOCK_M, la.shape[0], la.shape[1], 4), dtype=tl.float32)
    for g in tl.static_range(4):
        q = _q6_bytes(la, lb, hw, g)
        for i in tl.static_range(4):
            xp = tl.load(x_ptrs + (32 * (g // 2) + 2 * i + g % 2), mask=mask, other=0.0).to(tl.float32)
            prod = xp[:, None, :, :] * value_at(q, i)[None, :, :, :]
            if g < 2:
                part_a += prod
            else:
                part_b += prod
    return part_a, part_b


@triton.jit
def _load_quarter(l_ptr, h_ptr, s_ptr, l_off, h_off, s_off, w_mask, wn_mask, t: tl.constexpr):
    """Quarter t of each (n, block) of a step, as int32 words: `la` and `lb` the nibbles of its weights 0-31 and
    32-63, `hw` their high bits ((BLOCK_N, BLOCK_C, 4) each, one 16-byte load a row of 4), `sw` its four int8
    sub-scales ((BLOCK_N, BLOCK_C)).  l_off, h_off: quarter 0's word offsets; s_off: a block's first sub-scale
    word."""
    la = tl.load(l_ptr + l_off + 8 * t, mask=w_mask, other=0)
    lb = tl.load(l_ptr + l_off + (8 * t + 4), mask=w_mask, other=0)
    hw = tl.load(h_ptr + h_off + 4 * t, mask=w_mask, other=0)
    sw = tl.load(s_ptr + s_off + t, mask=wn_mask, other=0)
    return la, lb, hw, sw


@triton.jit
def _scaled(part_a, part_b, first, sw, AXIS: tl.constexpr):
    """A quarter's sum: the per-word partials of its two halves (words 0-1 of a half are one 16-weight
    sub-block, words 2-3 the next; `first` marks words 0-1) reduced per sub-block and scaled by its sub-scale."""
    s0 = tl.sum(tl.where(first, part_a, 0.0), axis=AXIS) * _sub_scale(sw, 0)
    s1 = tl.sum(tl.where(first, 0.0, part_a), axis=AXIS) * _sub_scale(sw, 1)
    s2 = tl.sum(tl.where(first, part_b, 0.0), axis=AXIS) * _sub_scale(sw, 2)
    s3 = tl.sum(tl.where(first, 0.0, part_b), axis=AXIS) * _sub_scale(sw, 3)
    return (s0 + s1) + (s2 + s3)


@triton.jit
def _q6_row_kernel(
    x_ptr,
    l_ptr,
    h_ptr,
    s_ptr,
    d_ptr,
    out_ptr,
    N,
    K,
    stride_ln,
    stride_hn,
    stride_sn,
    stride_dn,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One row (the single-stream decode): every tensor in the weights' own (BLOCK_N, BLOCK_C, 4) layout, x
    loaded in that layout too (each thread reads the x values of its own weights, from cache).  l_ptr, h_ptr,
    s_ptr: the nibbles, high bits and sub-scales as int32 words; d_ptr: float16 d."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, 4)
    first = rw[None, None, :] < 2
    n_mask = rn < N
    n_blocks = K // 256
    per_split = tl.cdiv(tl.cdiv(n_blocks, SPLIT_K), BLOCK_C) * BLOCK_C
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for c0 in range(pid_k * per_split, pid_k * per_split + per_split, BLOCK_C):
        rc = c0 + tl.arange(0, BLOCK_C)
        wn_mask = n_mask[:, None] & (rc < n_blocks)[None, :]  # (BLOCK_N, BLOCK_C)
        w_mask = wn_mask[:, :, None]
        d = tl.load(d_ptr + rn[:, None] * stride_dn + rc[None, :], mask=wn_mask, other=0.0).to(tl.float32)
        # (BLOCK_N, BLOCK_C, 4) word offsets of quarter 0: 32 nibble words and 16 high-bit words a block
        l_off = rn[:, None, None] * stride_ln + rc[None, :, None] * 32 + rw[None, None, :]
        h_off = rn[:, None, None] * stride_hn + rc[None, :, None] * 16 + rw[None, None, :]
        xk = rn[:, None, None] * 0 + rc[None, :, None] * 256 + rw[None, None, :] * 8  # the weights' layout
        s_off = rn[:, None] * stride_sn + rc[None, :] * 4
        blk = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
        for t in tl.static_range(4):
            la, lb, hw, sw = _load_quarter(l_ptr, h_ptr, s_ptr, l_off, h_off, s_off, w_mask, wn_mask, t)
            part_a, part_b = _row_partials(x_ptr + xk + 64 * t, w_mask, la, lb, hw)
            blk += _scaled(part_a, part_b, first, sw, 2)
        acc += tl.sum(blk * d, axis=1)
    if SPLIT_K == 1:
        tl.store(out_ptr + rn, acc.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.atomic_add(out_ptr + rn, acc, mask=n_mask)


@triton.jit
def _q6_rows_kernel(
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
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """2 to 16 rows: the one-row kernel's decode, each decoded weight multiplied with every row's x
    ((BLOCK_M, BLOCK_N, BLOCK_C, 4) products)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, 4)
    first = rw[None, None, None, :] < 2
    m_mask = rm < M
    n_mask = rn < N
    n_blocks = K // 256
    per_split = tl.cdiv(tl.cdiv(n_blocks, SPLIT_K), BLOCK_C) * BLOCK_C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c0 in range(pid_k * per_split, pid_k * per_split + per_split, BLOCK_C):
        rc = c0 + tl.arange(0, BLOCK_C)
        c_mask = rc < n_blocks
        wn_mask = n_mask[:, None] & c_mask[None, :]  # (BLOCK_N, BLOCK_C)
        w_mask = wn_mask[:, :, None]
        d = tl.load(d_ptr + rn[:, None] * stride_dn + rc[None, :], mask=wn_mask, other=0.0).to(tl.float32)
        l_off = rn[:, None, None] * stride_ln + rc[None, :, None] * 32 + rw[None, None, :]
        h_off = rn[:, None, None] * stride_hn + rc[None, :, None] * 16 + rw[None, None, :]
        # x of word w of each block: (BLOCK_M, BLOCK_C, 4)
        x_base = x_ptr + rm[:, None, None] * stride_xm + rc[None, :, None] * 256 + rw[None, None, :] * 8
        xm_mask = m_mask[:, None, None] & c_mask[None, :, None]
        s_off = rn[:, None] * stride_sn + rc[None, :] * 4
        blk = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_C), dtype=tl.float32)
        for t in tl.static_range(4):
            la, lb, hw, sw = _load_quarter(l_ptr, h_ptr, s_ptr, l_off, h_off, s_off, w_mask, wn_mask, t)
            part_a, part_b = _rows_partials(x_base + 64 * t, xm_mask, la, lb, hw, BLOCK_M)
            blk += _scaled(part_a, part_b, first, sw[None, :, :], 3)
        acc += tl.sum(blk * d[None, :, :], axis=2)
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=out_mask)


def supports(w: QuantWeight, m: int) -> bool:
    """Whether a call of `m` rows on `w` is this kernel's: 1..MAX_ROWS rows of q6, K a multiple of 256, every
    tensor contiguous along K."""
    return (
        1 <= m <= MAX_ROWS
        and w.kind == "q6"
        and w.in_features % BLOCK == 0
        and w.qhigh is not None
        and w.super_scales is not None
        and all(t.stride(-1) == 1 for t in (w.qweight, w.qhigh, w.scales, w.super_scales))
    )


def gpu_blocks(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_C, num_warps) on a GPU, rows padded to a power of two.  A thread takes a
    256-weight block a step (twelve 16-byte loads in flight) where the registers allow it: one row, 16 outputs by
    2 blocks and one warp (no shared memory); up to 4 rows 16 by 4 on 2 warps; 8 rows 32 by 4 on 4 warps.  16
    rows keep every product in registers only at 8-byte loads, 32 by 4 on 8 warps (16-byte loads there spilled
    120-170 bytes at every shape tried; tests/kernels/test_q6_gemv.py compiles each of these for sm_86 and sm_90).
    Chosen by what compiles cleanly; no GPU has timed them."""
    if m == 1:
        return 1, 16, 2, 1
    if m <= 4:
        return max(2, triton.next_power_of_2(m)), 16, 4, 2
    if m <= 8:
        return 8, 32, 4, 4
    return 16, 32, 4, 8


def pick_blocks(m: int, n: int, k: int, sms: int | None) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_C, SPLIT_K, num_warps): gpu_blocks, with K split until the grid covers the GPU's
    `sms` SMs twice.  Without a GPU (the Triton interpreter, which costs per program) 64 outputs and 4 blocks a
    program, one split."""
    if not sms:
        return max(1, triton.next_power_of_2(m)), 64, 4, 1, 1
    block_m, block_n, block_c, warps = gpu_blocks(m)
    return block_m, block_n, block_c, split_k_for(triton.cdiv(n, block_n), k // BLOCK, block_c, sms), warps


def q6_gemv_triton(
    x2: torch.Tensor, w: QuantWeight, *, blocks: tuple[int, int, int, int, int] | None = None
) -> torch.Tensor:
    """x2: (M, K), 1 <= M <= 16 -> (M, N) in x2's dtype (no bias: the caller adds it).  `blocks` overrides
    pick_blocks (tests use it for edge tiles and split K on small shapes)."""
    m, k = x2.shape
    n = w.out_features
    if not supports(w, m):
        raise ValueError(f"q6_gemv_triton takes 1..{MAX_ROWS} rows of q6 with K a multiple of {BLOCK}, got {m} rows")
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    block_m, block_n, block_c, split_k, warps = blocks or pick_blocks(m, n, k, sm_count(x2))
    # the same bytes as int32 words: (N, K / 8) nibbles, (N, K / 16) high bits, (N, K / 64) sub-scales
    low, high, subs = (t.view(torch.int32) for t in (w.qweight, w.qhigh, w.scales))
    out = split_k_output(x2, n, split_k)
    grid = (triton.cdiv(n, block_n), split_k)
    tensors = (x2, low, high, subs, w.super_scales, out)
    strides = (low.stride(0), high.stride(0), subs.stride(0), w.super_scales.stride(0))
    if block_m == 1:
        _q6_row_kernel[grid](
            *tensors, n, k, *strides, SPLIT_K=split_k, BLOCK_N=block_n, BLOCK_C=block_c, num_warps=warps
        )
    else:
        _q6_rows_kernel[grid](
            *tensors,
            m,
            n,
            k,
            x2.stride(0),
            *strides,
            out.stride(0),
            SPLIT_K=split_k,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_C=block_c,
            num_warps=warps,
        )
    return out.to(x2.dtype)
