"""kernels/int8_rows_cpu.py (fbgemm W8A8 with per-row residual activation quantization) against its float64
reference, against a float matmul, and row by row against itself in batches."""

from __future__ import annotations

import pytest
import torch

from kernels.int8_rows_cpu import (
    PASSES,
    available,
    batch_invariant,
    int8_rows_matmul,
    int8_rows_matmul_reference,
    pack_int8_rows,
    quantize_int8_rows,
    split_rows,
)

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no fbgemm dynamic quantized linear")


def _weight(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    return w, pack_int8_rows(*quantize_int8_rows(w)), g


@pytest.mark.parametrize("m,n,k", [(1, 1, 32), (1, 17, 576), (3, 1025, 64), (17, 96, 1536), (2, 4096, 576)])
def test_matches_the_integer_reference(m: int, n: int, k: int) -> None:
    _, w, g = _weight(n, k, m * 1000 + n + k)
    x = (torch.randn(m, k, generator=g) * 4).bfloat16()
    out = int8_rows_matmul(x, w)
    want = int8_rows_matmul_reference(x, w.qweight, w.scales)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    # the dot products are exact integers: only the float32 scaling of the outputs differs
    assert (out - want).abs().max() <= 1e-5 * want.abs().max().clamp_min(1.0)


def test_two_passes_are_as_good_as_float_activations_despite_an_outlier_channel() -> None:
    w_float, w, g = _weight(512, 576, 1)
    x = torch.randn(6, 576, generator=g)
    x[:, 7] *= 40  # one outlier channel sets the first pass's scale (the starter's final hidden states have them)
    exact_act = x @ (w.qweight.float() * w.scales[:, None]).t()  # int8 weights, float activations
    err = (int8_rows_matmul(x, w) - exact_act).abs().max()
    one_pass_grid = x.abs().amax() / 63  # what a single 7-bit pass could resolve
    assert err <= 1e-3 * exact_act.abs().max()
    assert err < one_pass_grid * 1e-2
    # and the weight quantization itself stays small against the float weight
    assert (int8_rows_matmul(x, w) - x @ w_float.t()).abs().max() <= 2e-2 * (x @ w_float.t()).abs().max()


def test_a_row_gets_the_same_bits_alone_and_among_others() -> None:
    _, w, g = _weight(1000, 576, 2)
    x = torch.randn(9, 576, generator=g) * torch.logspace(-3, 2, 9)[:, None]  # rows of very different sizes
    together = int8_rows_matmul(x, w)
    for i in range(9):
        assert torch.equal(int8_rows_matmul(x[i : i + 1], w), together[i : i + 1])
    assert batch_invariant(w) is None


def test_zero_rows_and_split_rows_shapes() -> None:
    _, w, _ = _weight(33, 64, 3)
    x = torch.zeros(2, 64)
    assert torch.equal(int8_rows_matmul(x, w), torch.zeros(2, 33))
    a, s = split_rows(torch.randn(5, 64))
    assert a.shape == (PASSES * 5, 64) and s.shape == (PASSES * 5, 1)
    assert a.abs().max() <= 63 and torch.equal(a, a.round())


def test_pack_refuses_a_float_weight() -> None:
    with pytest.raises(ValueError, match="int8"):
        pack_int8_rows(torch.randn(4, 8), torch.ones(4))
