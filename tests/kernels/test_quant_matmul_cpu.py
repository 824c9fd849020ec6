"""torch's packed CPU kernels behind kernels/quant_matmul_cpu.py against the float32 reference matmul."""

from __future__ import annotations

import pytest
import torch

from backends.torch_engine.quantize import QuantLinear
from kernels.quant_matmul import quant_matmul_reference, quantize_int4, quantize_int8
from kernels.quant_matmul_cpu import cpu_supported, pack_for_cpu, quant_matmul_cpu

# bf16 activations and outputs: the error is bf16 rounding of x and of the result, relative to |out|
TOL = 2e-2


def _check(x: torch.Tensor, w, bias=None) -> None:
    ref = quant_matmul_reference(x.float(), w, None if bias is None else bias.float())
    out = quant_matmul_cpu(x, pack_for_cpu(w), bias)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    assert (out.float() - ref).abs().max() <= TOL * ref.abs().max()


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (13, 96, 384), (16, 256, 128)])
def test_int4_matches_reference(m: int, n: int, k: int, group_size: int) -> None:
    if k % group_size:
        pytest.skip("k is not a multiple of the group size")
    g = torch.Generator().manual_seed(m * n + k)
    w = quantize_int4(torch.randn(n, k, generator=g), group_size, torch.float32)
    _check(torch.randn(m, k, generator=g).bfloat16(), w)


@pytest.mark.parametrize("m,n,k", [(1, 64, 96), (13, 200, 576), (3, 8, 32)])
def test_int8_per_channel_matches_reference(m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m + n + k)
    w = quantize_int8(torch.randn(n, k, generator=g), None, torch.float32)
    bias = torch.randn(n, generator=g).bfloat16()
    _check(torch.randn(m, k, generator=g).bfloat16(), w, bias)


def test_leading_dimensions_are_kept() -> None:
    w = quantize_int4(torch.randn(64, 128), 32, torch.float32)
    x = torch.randn(2, 3, 128).bfloat16()
    assert quant_matmul_cpu(x, pack_for_cpu(w)).shape == (2, 3, 64)


def test_what_the_fast_kernels_refuse() -> None:
    w4 = quantize_int4(torch.randn(64, 128), 32, torch.float32)
    assert cpu_supported(w4, torch.bfloat16)
    assert not cpu_supported(w4, torch.float32)  # torch's fp32/fp16 variants are 10-100x slower
    assert not cpu_supported(w4, torch.float16)
    assert not cpu_supported(quantize_int4(torch.randn(64, 96), 48, torch.float32), torch.bfloat16)
    assert not cpu_supported(quantize_int8(torch.randn(64, 96), 48, torch.float32), torch.bfloat16)  # odd group
    with pytest.raises(ValueError, match="no fast CPU kernel"):
        pack_for_cpu(w4, torch.float32)
    with pytest.raises(ValueError, match="bfloat16 activations"):
        quant_matmul_cpu(torch.randn(1, 128), pack_for_cpu(w4))


def test_quant_linear_packs_in_place_and_keeps_its_output() -> None:
    w = quantize_int4(torch.randn(96, 192), 32, torch.float32)
    bias = torch.randn(96)
    layer = QuantLinear(w, bias.bfloat16())
    x = torch.randn(5, 192).bfloat16()
    before = layer(x).float()
    dense_bytes = w.nbytes
    assert layer.pack_for_cpu(torch.bfloat16)
    assert layer.qweight is None and "cpu-packed" in repr(layer)
    assert layer.nbytes <= dense_bytes
    after = layer(x).float()
    assert (after - before).abs().max() <= TOL * before.abs().max()
    with pytest.raises(RuntimeError, match="re-laid"):
        _ = layer.weight
    assert not QuantLinear(quantize_int8(torch.randn(8, 96), 48)).pack_for_cpu(torch.bfloat16)


@pytest.mark.parametrize("m", [1, 4, 13])
def test_group_wise_int8_runs_exactly_as_two_int4_halves(m: int) -> None:
    """GGUF Q8_0 (int8, group 32) has no CPU int8 kernel of its own: hi and lo nibbles of q + 128 through the
    int4 kernel reproduce d * q."""
    from backends.torch_engine.gguf_repack import repack_gguf

    g = torch.Generator().manual_seed(m)
    n, k = 48, 96
    d = (torch.rand(n * k // 32, generator=g) * 0.05 + 0.01).half()
    q = torch.randint(-128, 128, (n * k // 32, 32), generator=g, dtype=torch.int8)
    raw = torch.cat([d.view(torch.uint8).reshape(-1, 2), q.view(torch.uint8)], dim=1)  # Q8_0 blocks
    w = repack_gguf(raw, "Q8_0", n, k, torch.float32)
    assert cpu_supported(w, torch.bfloat16) and pack_for_cpu(w).kind == "int8-split"
    x = torch.randn(m, k, generator=g).bfloat16()
    _check(x, w)
    # no worse than the dense bf16 matmul of the same weights (what the engine did before)
    ref = quant_matmul_reference(x.float(), w)
    dense = torch.nn.functional.linear(x, (q.float() * d.float()[:, None]).reshape(n, k).bfloat16()).float()
    split = quant_matmul_cpu(x, pack_for_cpu(w)).float()
    assert (split - ref).abs().max() <= 3 * (dense - ref).abs().max() + 1e-3


def test_rows_take_a_fixed_kernel_inside_a_runner_step() -> None:
    """Under QUANTIZED_ROWS = n the first n rows take the packed kernel and the rest the dense copy, whatever
    else is in the call: a decode row's kernel does not depend on the batch.  Checked by which kernel gets which
    rows, not by bits (a CPU may block one kernel differently by row count: tests/greedy_agreement.py); the
    values agree with each row alone up to one bf16 rounding."""
    from backends.torch_engine.quantize import QUANTIZED_ROWS
    from tests.greedy_agreement import assert_same_up_to_rounding

    layer = QuantLinear(quantize_int4(torch.randn(64, 128), 32, torch.float32))
    layer.keep_dense_copy(torch.bfloat16)
    layer.pack_for_cpu(torch.bfloat16)
    calls: list[tuple[str, int]] = []
    fast, quantized, dense = layer._cpu_rows, layer._quantized, layer._dense_linear
    layer._cpu_rows = lambda x: (calls.append(("packed", x.shape[0])), fast(x))[1]
    layer._quantized = lambda x: (calls.append(("packed", x.shape[0])), quantized(x))[1]
    layer._dense_linear = lambda x: (calls.append(("dense", x.shape[0])), dense(x))[1]

    def kernels(fn) -> list[tuple[str, int]]:
        calls.clear()
        out = fn()
        kernels.out = out
        return list(calls)

    x = torch.randn(40, 128).bfloat16()
    assert kernels(lambda: torch.cat([layer(x[i : i + 1]) for i in range(3)])) == [("packed", 1)] * 3  # 1 row < 32
    quantized_alone = kernels.out
    assert kernels(lambda: layer(x[3:])) == [("dense", 37)]
    dense_alone = kernels.out
    token = QUANTIZED_ROWS.set(3)
    try:
        assert kernels(lambda: layer(x)) == [("packed", 3), ("dense", 37)]
        mixed = kernels.out
        assert kernels(lambda: layer(x[:1])) == [("packed", 1)]  # a lone decode row: still the packed kernel
    finally:
        QUANTIZED_ROWS.reset(token)
    assert_same_up_to_rounding(mixed[:3], quantized_alone, 1, "3 decode rows vs each alone")
    assert torch.equal(mixed[3:], dense_alone)  # the same call shape: 37 rows through the dense copy
    token = QUANTIZED_ROWS.set(0)
    try:
        assert kernels(lambda: layer(x[:2])) == [("dense", 2)]  # prompt rows
    finally:
        QUANTIZED_ROWS.reset(token)
