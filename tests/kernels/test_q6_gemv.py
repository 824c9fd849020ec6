"""q6 weights (GGUF Q6_K at its own 6.5625 bits, issue 42 item 1): the layout and its reference, the bit-exact
repack from Q6_K blocks against gguf's own dequantizer, the decode kernel (kernels/q6_gemv_triton.py) and the
tl.dot kernel past 16 rows (kernels/q6_matmul_triton.py) against the reference under the Triton interpreter (the
integer decode exactly), the dispatch, and the decode kernel compiled for sm_86, sm_89 and sm_90 (no GPU needed):
128-bit weight loads, no integer-to-float conversion, no spills, and at one row no shared memory."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from backends.errors import ModelFormatError
from backends.torch_engine.gguf_q6 import repack_q6k
from kernels import q6_gemv_triton as q6
from kernels import q6_matmul_triton, quant_matmul_triton
from kernels.quant_matmul import (
    QuantWeight,
    concat_rows,
    dequantize,
    pack_int4,
    pack_q6_high,
    quant_matmul_reference,
    unpack_q6_high,
)
from tests.kernels.conftest import device
from tests.kernels.test_quant_gemv import _close, _spills, compile_ptx

pytestmark = pytest.mark.kernels


def _q6(n: int, k: int, seed: int = 0) -> QuantWeight:
    """A random q6 weight: every 6-bit value, full-range int8 sub-scales, d of both signs."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 64, (n, k), generator=gen)
    sc = torch.randint(-128, 128, (n, k // 16), generator=gen).to(torch.int8)
    sign = torch.randint(0, 2, (n, k // 256), generator=gen) * 2 - 1
    d = (torch.rand(n, k // 256, generator=gen) + 0.5) * 1e-3 * sign
    qw = QuantWeight("q6", pack_int4(q & 15), sc, None, 16, k, n, qhigh=pack_q6_high(q >> 4), super_scales=d.half())
    return qw.to(device())


def _q6k_blocks(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """Random Q6_K blocks (n_blocks, 210): random bytes, d a random finite float16 (any exponent but inf/NaN's)."""
    blocks = np.frombuffer(bytearray(rng.bytes(n_blocks * 210)), dtype=np.uint8).reshape(n_blocks, 210).copy()
    d = blocks[:, 208:210].copy().view(np.uint16)
    d &= np.uint16(0xFBFF)  # exponent 31 (inf, NaN) becomes 30
    blocks[:, 208:210] = d.view(np.uint8)
    return blocks


# ---- layout and repack -----------------------------------------------------------------------------------------


def test_the_high_bits_lie_where_the_layout_says() -> None:
    k = 128
    for c, b, h, o in [(0, 0, 0, 0), (0, 5, 0, 1), (0, 15, 1, 0), (1, 3, 1, 1), (1, 0, 1, 0)]:
        high = torch.zeros(1, k, dtype=torch.uint8)
        high[0, 64 * c + 32 * h + 2 * b + o] = 3
        packed = pack_q6_high(high)
        want = torch.zeros(1, k // 4, dtype=torch.uint8)
        want[0, 16 * c + b] = 3 << (2 * (2 * h + o))
        assert torch.equal(packed, want), (c, b, h, o)
    values = torch.randint(0, 4, (3, 256), dtype=torch.uint8)
    assert torch.equal(unpack_q6_high(pack_q6_high(values)), values)


@pytest.mark.parametrize("rows,cols", [(1, 256), (3, 512), (5, 1024)])
def test_repack_is_bit_exact_against_gguf(rows: int, cols: int) -> None:
    blocks = _q6k_blocks(np.random.default_rng(rows * cols), rows * cols // 256)
    want = gguf_dequantize(blocks.reshape(rows, -1), GGMLQuantizationType.Q6_K)  # (rows, cols) float32
    qw = repack_q6k(torch.from_numpy(blocks), rows, cols)
    assert torch.equal(dequantize(qw), torch.from_numpy(np.ascontiguousarray(want)))
    assert qw.nbytes == blocks.nbytes  # held at the file's own 210 bytes per 256 weights: 6.5625 bits


def test_repack_refuses_a_wrong_size() -> None:
    blocks = torch.zeros(2 * 210 - 1, dtype=torch.uint8)
    with pytest.raises(ModelFormatError, match="420 uint8 bytes"):
        repack_q6k(blocks, 1, 512)
    with pytest.raises(ModelFormatError, match="multiple of 256"):
        repack_q6k(torch.zeros(210, dtype=torch.uint8), 1, 200)


def test_rows_concatenate_and_move_with_every_tensor() -> None:
    a, b = _q6(16, 256, 1), _q6(8, 256, 2)
    both = concat_rows([a, b]).to("cpu")
    assert both.qhigh.shape == (24, 64) and both.super_scales.shape == (24, 1)
    assert torch.equal(dequantize(both), torch.cat([dequantize(a.to("cpu")), dequantize(b.to("cpu"))]))


def test_rows_and_whole_blocks_of_columns_cut_every_tensor() -> None:
    """What tensor parallelism and the Q/K un-reordering do to a q6 weight (tp/layers._rows / _cols,
    QuantWeight.map_rows / columns): rows cut or reordered and 256-weight blocks of columns keep the weights;
    a column span inside a block is none (the caller dequantizes)."""
    from backends.torch_engine.tp.layers import _cols, _rows

    w = _q6(12, 768, 3).to("cpu")
    dense = dequantize(w)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(dequantize(w.map_rows(lambda t: t[order])), dense[order])
    assert torch.equal(dequantize(_rows(w, 2, 7)), dense[2:7])
    cut = w.columns(256, 768)
    assert cut is not None and cut.in_features == 512 and torch.equal(dequantize(cut), dense[:, 256:])
    assert w.column_unit == 256 and w.columns(32, 256) is None and w.columns(0, 300) is None
    inside = _cols(w, 128, 512, torch.float32)
    assert isinstance(inside, torch.Tensor) and torch.equal(inside, dense[:, 128:512])
    assert torch.equal(dequantize(_cols(w, 0, 512, torch.float32)), dense[:, :512])


# ---- the kernels against the reference (Triton interpreter on CPU, or the GPU) ------------------------------


# (M, N, K): one row and several, N off every tile (1, 17, 33, 40), K one block and several
CASES = [(1, 1, 256), (1, 17, 512), (1, 33, 768), (2, 17, 256), (5, 40, 512), (16, 16, 256)]


@pytest.mark.parametrize("m,n,k", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_kernel_matches_the_reference(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    qw = _q6(n, k, m + n)
    x = torch.randn(m, k, device=device()).to(dtype)
    _close(q6.q6_gemv_triton(x, qw), quant_matmul_reference(x, qw), dtype)


@pytest.mark.parametrize("m", [1, 3])
def test_split_k_and_edge_tiles(m: int) -> None:
    qw = _q6(19, 768, 7)  # three blocks
    x = torch.randn(m, 768, device=device())
    want = quant_matmul_reference(x, qw)
    gpu = (*q6.gpu_blocks(m)[:3], 1, 1)  # the GPU's own tiles, and edge cases around them
    bm = 1 if m == 1 else 4
    for blocks in [gpu, (bm, 16, 1, 3, 1), (bm, 8, 2, 2, 1), (bm, 16, 4, 1, 2)]:
        _close(q6.q6_gemv_triton(x, qw, blocks=blocks), want, torch.float32)


@pytest.mark.parametrize("m,n,k", [(17, 40, 256), (33, 70, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_dot_kernel_matches_the_reference(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    qw = _q6(n, k, m)
    x = torch.randn(m, k, device=device()).to(dtype)
    _close(q6_matmul_triton.q6_matmul_triton(x, qw), quant_matmul_reference(x, qw), dtype)


def test_the_integer_decode_is_exact() -> None:
    """One-hot rows pick single weights out: every decoded weight equals the reference's bit for bit (d * sc *
    (q - 32) is exact in float32, and the bit tricks lose nothing), through the one-row kernel, the 2-16 row
    kernel and the tl.dot kernel."""
    n, k = 24, 512
    qw = _q6(n, k, 3)
    eye = torch.eye(k, device=device())
    want = dequantize(qw).t()  # (K, N): row k is what a one-hot x at k picks out
    for start in range(0, k, 16):  # every weight, 16 rows a call
        assert torch.equal(q6.q6_gemv_triton(eye[start : start + 16], qw), want[start : start + 16]), start
    for pick in (0, 1, 2, 3, 15, 16, 33, 47, 63, 64, 127, 200, 255, 256, 300, 511):
        assert torch.equal(q6.q6_gemv_triton(eye[pick : pick + 1], qw), want[pick : pick + 1]), pick
    assert torch.equal(q6_matmul_triton.q6_matmul_triton(eye[:32], qw), want[:32])


def test_q6_calls_are_dispatched_by_rows(monkeypatch) -> None:
    calls: list[int] = []
    real = q6.q6_gemv_triton

    def counting(x2, w, **kw):  # type: ignore[no-untyped-def]
        calls.append(x2.shape[0])
        return real(x2, w, **kw)

    monkeypatch.setattr(q6, "q6_gemv_triton", counting)
    qw = _q6(16, 256, 5)
    bias = torch.randn(16, device=device())
    for m in (1, 16, 17):
        x = torch.randn(2, m, 256, device=device()) if m == 1 else torch.randn(m, 256, device=device())
        _close(quant_matmul_triton.quant_matmul_triton(x, qw, bias), quant_matmul_reference(x, qw, bias), torch.float32)
    assert calls == [2, 16]  # (2, 1, K) is two rows; 17 rows take the tl.dot kernel
    with pytest.raises(ValueError, match="q6 qhigh"):
        broken = QuantWeight("q6", qw.qweight, qw.scales, None, 16, 256, 16, None, qw.super_scales)
        quant_matmul_triton.quant_matmul_triton(torch.randn(1, 256, device=device()), broken)


# ---- compiled for real GPUs, no GPU needed -------------------------------------------------------------------

_TYPES = {"x_ptr": "*fp16", "l_ptr": "*i32", "h_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*fp16", "out_ptr": "*fp16"}


@pytest.fixture(scope="module")
def ptx() -> dict[str, str]:
    cases = {}
    _, block_n, block_c, warps = q6.gpu_blocks(1)
    for cc in (86, 89, 90):
        consts = {"SPLIT_K": 1, "BLOCK_N": block_n, "BLOCK_C": block_c}
        cases[f"row-{cc}"] = ("_q6_row_kernel", consts, cc, warps)
    for m in (4, 8, 16):
        block_m, block_n, block_c, warps = q6.gpu_blocks(m)
        for cc in (86, 90):
            consts = {"SPLIT_K": 1, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_C": block_c}
            cases[f"rows{m}-{cc}"] = ("_q6_rows_kernel", consts, cc, warps)
    return compile_ptx("kernels.q6_gemv_triton", _TYPES, cases)


_WIDE = r"ld\.global(?:\.\w+)*\.v4\.b32"


@pytest.mark.parametrize("cc", [86, 89, 90])
def test_one_row_compiles_to_wide_loads_no_conversions_no_shared_memory_no_spills(ptx, cc: int) -> None:
    code = ptx[f"row-{cc}"]
    # a thread's block a step, four quarters: nibbles of both halves and the high bits, each a 16-byte load
    assert len(re.findall(_WIDE, code)) >= 4 * 3, sorted(set(re.findall(r"ld\.global[\.\w]*", code)))
    assert not re.search(r"cvt\.rn\.f32\.[su](8|16|32)", code)  # values and sub-scales by bit tricks
    assert not re.search(r"(ld|st)\.shared", code)  # nothing through shared memory
    assert _spills(code, cc) == (0, 0)


@pytest.mark.parametrize("cc", [86, 90])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_more_rows_compile_to_vector_loads_without_conversions_or_spills(ptx, cc: int, m: int) -> None:
    code = ptx[f"rows{m}-{cc}"]
    # 16-byte weight loads up to 8 rows; 16 rows keep their products in registers only at 8 bytes (gpu_blocks)
    wide = _WIDE if m <= 8 else r"ld\.global(?:\.\w+)*\.v2\.b32"
    assert len(re.findall(wide, code)) >= 4 * 3, sorted(set(re.findall(r"ld\.global[\.\w]*", code)))
    assert not re.search(r"cvt\.rn\.f32\.[su](8|16|32)", code)
    assert _spills(code, cc) == (0, 0)


@pytest.mark.parametrize("cc", [86, 89, 90])
def test_the_dot_kernel_and_bf16_activations_compile_for_every_target(cc: int) -> None:
    """What a GPU engine runs past 16 rows (q6_matmul_triton's tl.dot kernel at the launcher's tiles) and at one row
    with bf16 activations (the engine's dtype on these cards) compiles for each target: the dot kernel to tensor-core
    MMAs without spills, the one-row kernel to the same wide loads as with fp16."""
    bf16 = {**_TYPES, "x_ptr": "*bf16", "out_ptr": "*bf16"}
    dot_types = {**bf16, "l_ptr": "*u8", "h_ptr": "*u8", "s_ptr": "*i8"}
    cases = {
        f"dot{block_m}": ("_q6_dot_kernel", {"IEEE": False, "BLOCK_M": block_m, "BLOCK_N": 64}, cc, 4)
        for block_m in (16, 64)
    }
    code = compile_ptx("kernels.q6_matmul_triton", dot_types, cases)
    for key, ptx_code in code.items():
        assert re.search(r"\bmma\.sync|\bwgmma\.", ptx_code), key
        assert _spills(ptx_code, cc) == (0, 0), key
    _, block_n, block_c, warps = q6.gpu_blocks(1)
    row = {"row": ("_q6_row_kernel", {"SPLIT_K": 1, "BLOCK_N": block_n, "BLOCK_C": block_c}, cc, warps)}
    row_code = compile_ptx("kernels.q6_gemv_triton", bf16, row)["row"]
    assert len(re.findall(_WIDE, row_code)) >= 4 * 3 and _spills(row_code, cc) == (0, 0)
