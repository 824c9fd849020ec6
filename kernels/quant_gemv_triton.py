"""Triton decode kernel for 1 to 16 rows of int4 / int8 weights in groups (kernels/quant_matmul.py's layouts).

out[m, n] = sum_g scale[n, g] * (sum_{k in g} x[m, k] * q[n, k]) + offset[n, g] * (sum_{k in g} x[m, k])

The reference is kernels/quant_matmul.py's quant_matmul_reference; quant_matmul_triton sends decode-sized
calls here.  Why a kernel of its own (issue 42; the first GPU run measured int4 decode at 7.5 % of bandwidth): the
tl.dot kernel pads one row to a 16-row MMA tile and spends its time decoding weights, not reading them.  Here:

- no MMA: every row is a broadcast product and a tl.sum over K, so 1 row costs what it reads, and 16 rows
  reuse each decoded weight 16 times from registers;
- the weights are read as int32 words, a 32-weight chunk at a time (int4: 4 words = 16 bytes; int8: 8 words =
  32 bytes), so each thread issues 16-byte vector loads along a row (the layout needs nothing re-laid: a row's
  chunk is contiguous);
- a chunk's scale and offset are loaded once (one per 32 weights, per row), and the offset is applied once per
  chunk as offset x sum(x) rather than per weight;
- a weight becomes a float by bit tricks, not a conversion instruction: a nibble q ORed into the bits of 2^23 is
  the float 2^23 + q exactly, so q = bits - 2^23 (one integer OR and one float subtraction); a signed byte v is
  (bits of 1.5 x 2^23) + v, minus 1.5 x 2^23;
- the grid is rows of N times chunks of K (split K with float32 atomics) so that even a small N fills every SM;
- one row has a kernel of its own (`_gemv_row_kernel`): one warp a program, every tensor in the weights' own
  layout, so it compiles to 128-bit weight loads and no shared memory at all (checked for sm_86, sm_89 and sm_90
  in tests/kernels/test_quant_gemv.py); 2 to 16 rows share `_gemv_kernel`, whose row dimension costs a few
  shared-memory layout changes.

Layout requirements: in_features a multiple of 32 and group_size a multiple of 32 (GGUF blocks, per-channel
int8, the loader's groups of 128), weights contiguous along K.  `supports(w, m)` says whether a call qualifies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_matmul import QuantWeight

CHUNK = 32  # weights per chunk: one scale each
MAX_ROWS = 16  # decode rows this kernel takes; more go to the tl.dot kernel


@triton.jit
def _weight_at(words, p: tl.constexpr, INT4: tl.constexpr):
    """Weight p of each int32 word as float32, by bit tricks rather than a conversion instruction: a nibble ORed
    into the bits of 2**23 is the float 2**23 + q; a signed byte added to the bits of 1.5 * 2**23 is 1.5 * 2**23 +
    v (the module docstring)."""
    if INT4:
        return (((words >> (4 * p)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return (((words << (24 - 8 * p)) >> 24) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _gemv_kernel(
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
    stride_wn,
    stride_sn,
    stride_om,
    INT4: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # int32 words per 32-weight chunk, and weights per word
    WORDS: tl.constexpr = 4 if INT4 else 8
    PER_WORD: tl.constexpr = 8 if INT4 else 4
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, WORDS)
    m_mask = rm < M
    n_mask = rn < N
    n_chunks = K // 32
    per_split = tl.cdiv(tl.cdiv(n_chunks, SPLIT_K), BLOCK_C) * BLOCK_C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c0 in range(pid_k * per_split, pid_k * per_split + per_split, BLOCK_C):
        rc = c0 + tl.arange(0, BLOCK_C)
        c_mask = rc < n_chunks
        wn_mask = n_mask[:, None] & c_mask[None, :]  # (BLOCK_N, BLOCK_C)
        # (BLOCK_N, BLOCK_C, WORDS) int32: each (n, c) a chunk's contiguous 16 or 32 bytes
        w_off = rn[:, None, None] * stride_wn + (rc[None, :, None] * WORDS + rw[None, None, :])
        words = tl.load(w_ptr + w_off, mask=wn_mask[:, :, None], other=0)
        g = (rc * 32) // group_size  # the chunk's group: its scale (and offset)
        s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :], mask=wn_mask, other=0.0).to(tl.float32)
        # x of the chunks, for the offset term: (BLOCK_M, BLOCK_C)
        x_base = x_ptr + rm[:, None, None] * stride_xm + rc[None, :, None] * 32
        xm_mask = m_mask[:, None, None] & c_mask[None, :, None]
        part = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_C), dtype=tl.float32)
        xsum = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
        for p in tl.static_range(PER_WORD):
            wf = _weight_at(words, p, INT4)
            # x[m, chunk c, word w, position p] = x[m, 32 c + PER_WORD w + p]: (BLOCK_M, BLOCK_C, WORDS)
            xp = tl.load(x_base + rw[None, None, :] * PER_WORD + p, mask=xm_mask, other=0.0).to(tl.float32)
            part += tl.sum(xp[:, None, :, :] * wf[None, :, :, :], axis=3)
            xsum += tl.sum(xp, axis=2)
        chunk = part * s[None, :, :]
        if INT4:
            o = tl.load(o_ptr + rn[:, None] * stride_sn + g[None, :], mask=wn_mask, other=0.0).to(tl.float32)
            chunk += xsum[:, None, :] * o[None, :, :]
        acc += tl.sum(chunk, axis=2)
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=out_mask)


@triton.jit
def _gemv_row_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    N,
    K,
    group_size,
    stride_wn,
    stride_sn,
    INT4: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One row (the single-stream decode): every tensor in the weights' own 3D layout, x loaded in that layout
    too (each thread reads the x values of its own weights, from cache), so nothing crosses shared memory; one
    warp a program, many programs."""
    WORDS: tl.constexpr = 4 if INT4 else 8
    PER_WORD: tl.constexpr = 8 if INT4 else 4
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, WORDS)
    n_mask = rn < N
    n_chunks = K // 32
    per_split = tl.cdiv(tl.cdiv(n_chunks, SPLIT_K), BLOCK_C) * BLOCK_C
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for c0 in range(pid_k * per_split, pid_k * per_split + per_split, BLOCK_C):
        rc = c0 + tl.arange(0, BLOCK_C)
        wn_mask = n_mask[:, None] & (rc < n_chunks)[None, :]  # (BLOCK_N, BLOCK_C)
        w_off = rn[:, None, None] * stride_wn + (rc[None, :, None] * WORDS + rw[None, None, :])
        words = tl.load(w_ptr + w_off, mask=wn_mask[:, :, None], other=0)  # (BLOCK_N, BLOCK_C, WORDS)
        g = (rc * 32) // group_size
        s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :], mask=wn_mask, other=0.0).to(tl.float32)
        xk = rn[:, None, None] * 0 + rc[None, :, None] * 32 + rw[None, None, :] * PER_WORD  # the weights' layout
        part = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
        xsum = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
        for p in tl.static_range(PER_WORD):
            wf = _weight_at(words, p, INT4)
            xp = tl.load(x_ptr + xk + p, mask=wn_mask[:, :, None], other=0.0).to(tl.float32)
            part += tl.sum(xp * wf, axis=2)
            xsum += tl.sum(xp, axis=2)
        chunk = part * s
        if INT4:
            o = tl.load(o_ptr + rn[:, None] * stride_sn + g[None, :], mask=wn_mask, other=0.0).to(tl.float32)
            chunk += xsum * o
        acc += tl.sum(chunk, axis=1)
    if SPLIT_K == 1:
        tl.store(out_ptr + rn, acc.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.atomic_add(out_ptr + rn, acc, mask=n_mask)


def supports(w: QuantWeight, m: int) -> bool:
    """Whether a call of `m` rows on `w` is this kernel's: 1..MAX_ROWS rows, int4 or int8 in 32-multiples,
    weights contiguous along K."""
    return (
        1 <= m <= MAX_ROWS
        and w.kind in ("int4", "int8")
        and w.in_features % CHUNK == 0
        and w.group_size % CHUNK == 0
        and w.qweight.stride(-1) == 1
        and w.scales.stride(-1) == 1
        and (w.offsets is None or w.offsets.stride() == w.scales.stride())
    )


def gpu_blocks(m: int, int4: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_C, num_warps) on a GPU.  One row: 16 outputs a program and one warp, 4 chunks of
    int4 or 2 of int8 a step (16 bytes a thread a load: the shapes that compile to 128-bit loads and no shared
    memory, tests/kernels/test_quant_gemv.py); more rows: the rows padded to a power of two, 4 warps."""
    if m == 1:
        return 1, 16, 4 if int4 else 2, 1
    return max(2, triton.next_power_of_2(m)), 16, 4, 4


def pick_blocks(m: int, n: int, k: int, sms: int | None, int4: bool = True) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_C, SPLIT_K, num_warps): gpu_blocks, with K split until the grid covers the GPU's
    `sms` SMs twice.  Without a GPU (sms None: the Triton interpreter, which runs a program at a time on the CPU
    and costs per program, not per byte) 64 outputs and 8 chunks a program, one split."""
    if not sms:
        return max(1, triton.next_power_of_2(m)), 64, 8, 1, 1
    block_m, block_n, block_c, warps = gpu_blocks(m, int4)
    return block_m, block_n, block_c, split_k_for(triton.cdiv(n, block_n), k // CHUNK, block_c, sms), warps


def split_k_for(tiles: int, steps: int, per_program: int, sms: int) -> int:
    """How many ways to split K (a power of two): until `tiles` output tiles x the splits cover the GPU's `sms` SMs
    twice, while each split keeps at least two programs' worth (`per_program` of the `steps` K steps each)."""
    split_k = 1
    while tiles * split_k < 2 * sms and steps // (per_program * split_k * 2) >= 2:
        split_k *= 2
    return split_k


def sm_count(x: torch.Tensor) -> int | None:
    """The SMs of x's GPU (what split_k_for fills), None on the CPU (the Triton interpreter)."""
    return torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else None


def split_k_output(x2: torch.Tensor, n: int, split_k: int) -> torch.Tensor:
    """The (M, N) output a decode kernel writes: x2's dtype, or with K split float32 zeros the splits add into."""
    if split_k > 1:
        return torch.zeros((x2.shape[0], n), device=x2.device, dtype=torch.float32)
    return torch.empty((x2.shape[0], n), device=x2.device, dtype=x2.dtype)


def quant_gemv_triton(
    x2: torch.Tensor, w: QuantWeight, *, blocks: tuple[int, int, int, int, int] | None = None
) -> torch.Tensor:
    """x2: (M, K), 1 <= M <= 16 -> (M, N) in x2's dtype (no bias: the caller adds it).  `blocks` overrides
    pick_blocks (tests use it for edge tiles and split K on tiny shapes)."""
    m, k = x2.shape
    n = w.out_features
    if not supports(w, m):
        raise ValueError(f"quant_gemv_triton takes 1..{MAX_ROWS} rows of int4/int8 in 32-multiples, got {m} rows")
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    int4 = w.kind == "int4"
    block_m, block_n, block_c, split_k, warps = blocks or pick_blocks(m, n, k, sm_count(x2), int4)
    words = w.qweight.view(torch.int32)  # (N, K / 8) for int4, (N, K / 4) for int8: the same bytes
    out = split_k_output(x2, n, split_k)
    offsets = w.offsets if w.offsets is not None else w.scales  # unused for int8
    grid = (triton.cdiv(n, block_n), split_k)
    if block_m == 1:
        _gemv_row_kernel[grid](
            x2,
            words,
            w.scales,
            offsets,
            out,
            n,
            k,
            w.group_size,
            words.stride(0),
            w.scales.stride(0),
            INT4=int4,
            SPLIT_K=split_k,
            BLOCK_N=block_n,
            BLOCK_C=block_c,
            num_warps=warps,
        )
    else:
        _gemv_kernel[grid](
            x2,
            words,
            w.scales,
            offsets,
            out,
            m,
            n,
            k,
            w.group_size,
            x2.stride(0),
            words.stride(0),
            w.scales.stride(0),
            out.stride(0),
            INT4=int4,
            SPLIT_K=split_k,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_C=block_c,
            num_warps=warps,
        )
    return out.to(x2.dtype)
