"""MoE routing and the grouped expert matmul (kernels/moe.py, kernels/moe_triton.py) against the per-token
reference, on awkward shapes: one token, an expert with no tokens, every token on one expert, row counts that
are the tile size +- 1, widths that are not multiples of the blocks."""

from __future__ import annotations

import pytest
import torch

from kernels.moe import (
    grouped_matmul_torch,
    moe_experts_grouped,
    moe_experts_reference,
    moe_experts_torch,
    route,
    sort_by_expert,
)
from kernels.moe_triton import BLOCK_M, grouped_matmul_triton, moe_experts_triton, tile_table
from tests.kernels.conftest import device

pytestmark = pytest.mark.kernels
TOL = {torch.float16: 3e-3, torch.float32: 2e-5}
DTYPES = [torch.float16, torch.float32]


def _weights(n_experts: int, hidden: int, ffn: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(n_experts, 2 * ffn, hidden, generator=g) / hidden**0.5).to(dtype).to(device())
    down = (torch.randn(n_experts, hidden, ffn, generator=g) / ffn**0.5).to(dtype).to(device())
    return gate_up, down


def test_route_softmax_then_top_k_and_renormalise() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 1.0, 3.0, -1.0]])
    w, ids = route(logits, 2, normalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[0, 1], [2, 1]]
    torch.testing.assert_close(w, torch.stack([probs[0, :2], probs[1, [2, 1]]]))
    wn, ids_n = route(logits, 2, normalize=True)
    assert torch.equal(ids_n, ids)
    torch.testing.assert_close(wn.sum(-1), torch.ones(2))
    torch.testing.assert_close(wn[0, 0] / wn[0, 1], w[0, 0] / w[0, 1])


def test_sort_by_expert_groups_pairs_and_counts_empty_experts() -> None:
    ids = torch.tensor([[3, 0], [0, 3], [3, 1]])
    order, offsets = sort_by_expert(ids, 5)
    assert offsets.tolist() == [0, 2, 3, 3, 6, 6]  # expert 2 and 4: no pairs
    assert ids.reshape(-1)[order].tolist() == [0, 0, 1, 3, 3, 3]
    assert order.tolist() == [1, 2, 5, 0, 3, 4]  # stable: pairs of one expert in token order


@pytest.mark.parametrize("counts", [[0, 5, 0, 1], [BLOCK_M - 1, BLOCK_M, BLOCK_M + 1], [33], [0, 0, 0]])
def test_tile_table_covers_every_row_once(counts: list[int]) -> None:
    offsets = torch.tensor([0] + counts).cumsum(0)
    m = int(offsets[-1])
    experts, starts, ends = tile_table(offsets, m, BLOCK_M)
    covered = []
    for e, s, t in zip(experts.tolist(), starts.tolist(), ends.tolist()):
        assert t - s <= BLOCK_M
        if t > s:
            assert offsets[e] <= s and t <= offsets[e + 1]
            covered += range(s, t)
    assert sorted(covered) == list(range(m))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "counts,n,k",
    [
        ([1], 64, 64),
        ([0, 17, 0, 3], 100, 48),
        ([BLOCK_M + 1, BLOCK_M - 1], 65, 33),
        ([5, 0, 0, 0, 0, 0, 0, 2], 128, 96),
    ],
)
def test_grouped_matmul_triton_matches_torch(dtype: torch.dtype, counts: list[int], n: int, k: int) -> None:
    g = torch.Generator().manual_seed(1)
    offsets = torch.tensor([0] + counts).cumsum(0).to(device())
    x = torch.randn(int(offsets[-1]), k, generator=g).to(dtype).to(device())
    w = (torch.randn(len(counts), n, k, generator=g) / k**0.5).to(dtype).to(device())
    want = grouped_matmul_torch(x.float(), w.float(), offsets)
    got = grouped_matmul_triton(x, w, offsets)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype] * 4, rtol=TOL[dtype] * 4)


def test_grouped_matmul_triton_refuses_shapes_that_do_not_multiply() -> None:
    w = torch.zeros(2, 8, 16, device=device())
    with pytest.raises(ValueError, match="do not multiply"):
        grouped_matmul_triton(torch.zeros(3, 15, device=device()), w, torch.tensor([0, 1, 3], device=device()))
    with pytest.raises(ValueError, match="offsets"):
        grouped_matmul_triton(torch.zeros(3, 16, device=device()), w, torch.tensor([0, 3], device=device()))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,experts,top_k,hidden,ffn", [(1, 4, 2, 64, 32), (17, 8, 2, 48, 40), (5, 3, 3, 32, 16)])
def test_moe_experts_match_the_reference(
    impl: str, dtype: torch.dtype, tokens: int, experts: int, top_k: int, hidden: int, ffn: int
) -> None:
    gate_up, down = _weights(experts, hidden, ffn, dtype)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, hidden, generator=g).to(dtype).to(device())
    weights, ids = route(torch.randn(tokens, experts, generator=g).to(device()), top_k, normalize=True)
    want = moe_experts_reference(x, gate_up, down, weights, ids)
    fn = moe_experts_torch if impl == "torch" else moe_experts_triton
    got = fn(x, gate_up, down, weights, ids)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype] * 4, rtol=TOL[dtype] * 4)


def test_all_tokens_on_one_expert_and_the_others_idle() -> None:
    gate_up, down = _weights(6, 32, 16, torch.float32)
    x = torch.randn(9, 32, device=device())
    ids = torch.full((9, 1), 4, device=device())
    weights = torch.ones(9, 1, device=device())
    want = moe_experts_reference(x, gate_up, down, weights, ids)
    torch.testing.assert_close(
        moe_experts_grouped(x, gate_up, down, weights, ids, grouped_matmul_triton), want, atol=1e-5, rtol=1e-5
    )
