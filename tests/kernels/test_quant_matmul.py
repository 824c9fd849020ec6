"""Quantized matmul: layouts round-trip, the Triton kernel matches the reference on awkward shapes."""

from __future__ import annotations

import pytest
import torch

from kernels.quant_matmul import (
    QuantWeight,
    dequantize,
    pack_int4,
    quant_matmul_reference,
    quant_matmul_torch,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from tests.kernels.conftest import device

pytestmark = pytest.mark.kernels

TOL = {torch.float16: 2e-2, torch.float32: 2e-4, torch.bfloat16: 5e-2}


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    scale = b.float().abs().max().clamp(min=1.0)
    err = (a.float() - b.float()).abs().max() / scale
    assert err <= TOL[dtype], f"max rel err {err:.3g} > {TOL[dtype]}"


def test_pack_roundtrip() -> None:
    q = torch.randint(0, 16, (5, 34))
    assert torch.equal(unpack_int4(pack_int4(q)).long(), q)
    assert pack_int4(torch.tensor([[1, 2]])).item() == 0x21  # k=0 low nibble, k=1 high nibble


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_quantize_error_small(kind: str) -> None:
    torch.manual_seed(0)
    w = torch.randn(48, 256, dtype=torch.float16)
    qw = {"int8": lambda: quantize_int8(w), "int4": lambda: quantize_int4(w, 128), "fp8": lambda: quantize_fp8(w)}[
        kind
    ]()
    rel = (dequantize(qw) - w.float()).norm() / w.float().norm()
    assert rel < {"int8": 0.01, "int4": 0.12, "fp8": 0.05}[kind], rel
    bits = qw.nbytes * 8 / w.numel()
    assert bits < {"int8": 8.2, "int4": 4.3, "fp8": 8.2}[kind]


def test_torch_path_matches_reference() -> None:
    torch.manual_seed(0)
    w = quantize_int4(torch.randn(40, 256), 64, torch.float32)
    x = torch.randn(3, 5, 256)
    _close(quant_matmul_torch(x, w), quant_matmul_reference(x, w), torch.float32)


# (M, N, K, group size): M = tokens (1, 15, 16, 17 around the 16-row tile), N/K off the tile edges.
CASES = [(1, 64, 128, 128), (15, 40, 256, 128), (16, 96, 128, 32), (17, 72, 384, 128), (3, 130, 64, 32)]


def _make(kind: str, n: int, k: int, g: int, dtype: torch.dtype) -> QuantWeight:
    w = torch.randn(n, k, dtype=torch.float32)
    if kind == "int8":
        return quantize_int8(w, None if g == k else g, dtype).to(device())
    return quantize_int4(w, g, dtype).to(device())


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("m,n,k,g", CASES)
def test_triton_matches_reference(kind: str, m: int, n: int, k: int, g: int) -> None:
    from kernels.quant_matmul_triton import quant_matmul_triton

    torch.manual_seed(m * 1000 + n)
    dtype = torch.float16 if (m + n) % 2 else torch.float32
    w = _make(kind, n, k, g, dtype)
    x = torch.randn(m, k, dtype=dtype, device=device())
    _close(quant_matmul_triton(x, w, blocks=(16, 32, 64, 1)), quant_matmul_reference(x, w), dtype)


def test_triton_split_k_and_bias() -> None:
    from kernels.quant_matmul_triton import quant_matmul_triton

    torch.manual_seed(1)
    w = _make("int4", 48, 512, 128, torch.float16)
    x = torch.randn(2, 512, dtype=torch.float16, device=device())
    bias = torch.randn(48, dtype=torch.float16, device=device())
    _close(quant_matmul_triton(x, w, bias, blocks=(16, 32, 128, 2)), quant_matmul_reference(x, w, bias), torch.float16)


def test_triton_strided_input() -> None:
    from kernels.quant_matmul_triton import quant_matmul_triton

    w = _make("int8", 32, 128, 128, torch.float32)
    x = torch.randn(128, 4, device=device()).t()  # (4, 128), non-contiguous
    _close(quant_matmul_triton(x, w, blocks=(16, 32, 64, 1)), quant_matmul_reference(x, w), torch.float32)


def test_launcher_rejects_bad_input() -> None:
    from kernels.quant_matmul_triton import quant_matmul_triton

    w = _make("int4", 32, 128, 32, torch.float32)
    with pytest.raises(ValueError, match="input features"):
        quant_matmul_triton(torch.randn(2, 64, device=device()), w)
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        quant_matmul_triton(torch.ones(2, 128, dtype=torch.int32, device=device()), w)
    bad = QuantWeight("int4", w.qweight, w.scales[:, :2], w.offsets, 32, 128, 32)
    with pytest.raises(ValueError, match="scales shape"):
        quant_matmul_triton(torch.randn(2, 128, device=device()), bad)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 13, 16, 17, 1025])
@pytest.mark.parametrize("n,k", [(4096, 4096), (11008, 4096), (4096, 11008), (130, 384)])
def test_triton_full_matrix_gpu(kind: str, dtype: torch.dtype, m: int, n: int, k: int) -> None:
    from kernels.quant_matmul import fp8_supported
    from kernels.quant_matmul_triton import quant_matmul_triton

    if kind == "fp8" and not fp8_supported(torch.device("cuda")):
        pytest.skip("FP8 needs compute capability >= 8.9")
    w = torch.randn(n, k, device="cuda")
    qw = {
        "int8": lambda: quantize_int8(w, None, dtype),
        "int4": lambda: quantize_int4(w, 128, dtype),
        "fp8": lambda: quantize_fp8(w, dtype),
    }[kind]()
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    _close(quant_matmul_triton(x, qw), quant_matmul_reference(x, qw), dtype)
