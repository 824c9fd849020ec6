"""Paged decode / prefill attention (Triton) vs the gather-and-softmax references on awkward shapes."""

from __future__ import annotations

import pytest
import torch

from kernels.attention_triton import (
    paged_decode_reference,
    paged_decode_triton,
    paged_prefill_reference,
    paged_prefill_triton,
)
from tests.kernels.conftest import device

pytestmark = pytest.mark.kernels
TOL = {torch.float16: 3e-3, torch.float32: 1e-4, torch.bfloat16: 2e-2}
BS = 16


def _cache(lens: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, dev: str):
    """Random K/V caches with each sequence's blocks scattered over a shuffled pool."""
    need = [(n + BS - 1) // BS for n in lens]
    pool = sum(need) + 3
    k_cache = torch.randn(pool, BS, kv_heads, head_dim, dtype=dtype, device=dev)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(pool)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[at : at + n]
        at += n
    return k_cache, v_cache, tables.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev)


DECODE = [  # (seq lens, heads, kv heads, head dim, blocks per split)
    ([1], 4, 4, 64, None),
    ([15, 16, 17], 9, 3, 64, None),
    ([40], 8, 1, 128, 1),
    ([33, 1, 16], 8, 1, 64, 1),
    ([17], 3, 1, 64, 2),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("lens,heads,kv_heads,head_dim,split", DECODE)
def test_paged_decode(dtype, lens, heads, kv_heads, head_dim, split) -> None:
    torch.manual_seed(len(lens) * 100 + heads)
    dev = device()
    k_cache, v_cache, tables, seq_lens = _cache(lens, kv_heads, head_dim, dtype, dev)
    q = torch.randn(len(lens), heads, head_dim, dtype=dtype, device=dev)
    scale = head_dim**-0.5
    got = paged_decode_triton(q, k_cache, v_cache, tables, seq_lens, scale, blocks_per_split=split)
    want = paged_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


PREFILL = [  # (query lens, prefix lens, heads, kv heads, head dim)
    ([17], [0], 4, 4, 64),
    ([1, 15, 16], [16, 5, 0], 9, 3, 64),
    ([17, 3], [15, 1], 8, 1, 128),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("q_lens,prefix,heads,kv_heads,head_dim", PREFILL)
def test_paged_prefill(dtype, q_lens, prefix, heads, kv_heads, head_dim) -> None:
    torch.manual_seed(sum(q_lens))
    dev = device()
    lens = [a + b for a, b in zip(q_lens, prefix)]
    k_cache, v_cache, tables, seq_lens = _cache(lens, kv_heads, head_dim, dtype, dev)
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(q_lens), 0)), dtype=torch.int32, device=dev)
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device=dev)
    scale = head_dim**-0.5
    got = paged_prefill_triton(q, k_cache, v_cache, tables, seq_lens, cu, scale)
    want = paged_prefill_reference(q, k_cache, v_cache, tables, seq_lens, cu, scale)
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


def test_decode_rejects_bad_heads() -> None:
    dev = device()
    k_cache, v_cache, tables, seq_lens = _cache([3], 3, 64, torch.float32, dev)
    with pytest.raises(ValueError, match="not a multiple"):
        paged_decode_triton(torch.randn(1, 4, 64, device=dev), k_cache, v_cache, tables, seq_lens, 0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 13])
@pytest.mark.parametrize("max_len", [1, 15, 16, 17, 1025])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 8, 64), (24, 8, 128), (32, 4, 128)])
def test_paged_attention_full_matrix_gpu(dtype, batch, max_len, heads, kv_heads, head_dim) -> None:
    lens = torch.randint(1, max_len + 1, (batch,)).tolist()
    lens[0] = max_len
    k_cache, v_cache, tables, seq_lens = _cache(lens, kv_heads, head_dim, dtype, "cuda")
    scale = head_dim**-0.5
    q = torch.randn(batch, heads, head_dim, dtype=dtype, device="cuda")
    torch.testing.assert_close(
        paged_decode_triton(q, k_cache, v_cache, tables, seq_lens, scale),
        paged_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale),
        atol=TOL[dtype],
        rtol=TOL[dtype],
    )
    q_lens = [max(1, n // 2) for n in lens]
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(q_lens), 0)), dtype=torch.int32, device="cuda")
    qp = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device="cuda")
    torch.testing.assert_close(
        paged_prefill_triton(qp, k_cache, v_cache, tables, seq_lens, cu, scale),
        paged_prefill_reference(qp, k_cache, v_cache, tables, seq_lens, cu, scale),
        atol=TOL[dtype],
        rtol=TOL[dtype],
    )


@pytest.mark.parametrize("q_lens,prefix", [([1, 1, 1], [0, 15, 16]), ([1, 17, 1], [16, 0, 3])])
def test_model_contract_mixed_batch(q_lens, prefix) -> None:
    attention = pytest.importorskip("kernels.attention")
    from kernels.attention_triton import paged_attention_triton

    torch.manual_seed(3)
    dev = device()
    lens = [a + b for a, b in zip(q_lens, prefix)]
    k_cache, v_cache, tables, _ = _cache(lens, 3, 64, torch.float16, dev)
    seqs = [
        (p, n, tuple(int(x) for x in tables[s, : (p + n + BS - 1) // BS]))
        for s, (n, p) in enumerate(zip(q_lens, prefix))
    ]
    meta = attention.build_attention_metadata(seqs, BS, dev)
    q = torch.randn(sum(q_lens), 9, 64, dtype=torch.float16, device=dev)
    torch.testing.assert_close(
        paged_attention_triton(q, k_cache, v_cache, meta, 0.125),
        attention.paged_attention_reference(q, k_cache, v_cache, meta, 0.125),
        atol=3e-3,
        rtol=3e-3,
    )
