"""The Triton paged attention with a cache stored in another float type than q (an fp16 cache under bf16 compute
is the CUDA default: LoadOptions.kv_cache_type "f16", dtype "auto"): K/V are cast to q's dtype on load."""

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
BS = 16


# (q dtype, cache dtype, tolerance): the interpreter has no bf16 arithmetic, so fp16/fp32 pairs here
@pytest.mark.parametrize(
    "q_dtype,kv_dtype,tol", [(torch.float32, torch.float16, 1e-4), (torch.float16, torch.float32, 3e-3)]
)
def test_cache_in_another_float_type(q_dtype: torch.dtype, kv_dtype: torch.dtype, tol: float) -> None:
    torch.manual_seed(5)
    dev = device()
    lens = [17, 3]
    k_cache = torch.randn(6, BS, 2, 64, dtype=kv_dtype, device=dev)
    v_cache = torch.randn_like(k_cache)
    tables = torch.tensor([[4, 1], [2, 0]], dtype=torch.int32, device=dev)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(2, 6, 64, dtype=q_dtype, device=dev)
    got = paged_decode_triton(q, k_cache, v_cache, tables, seq_lens, 0.125, blocks_per_split=1)
    assert got.dtype == q_dtype
    torch.testing.assert_close(
        got, paged_decode_reference(q, k_cache, v_cache, tables, seq_lens, 0.125), atol=tol, rtol=tol
    )
    cu = torch.tensor([0, 5, 8], dtype=torch.int32, device=dev)  # chunks of 5 and 3 on cached prefixes
    qp = torch.randn(8, 6, 64, dtype=q_dtype, device=dev)
    torch.testing.assert_close(
        paged_prefill_triton(qp, k_cache, v_cache, tables, seq_lens, cu, 0.125),
        paged_prefill_reference(qp, k_cache, v_cache, tables, seq_lens, cu, 0.125),
        atol=tol,
        rtol=tol,
    )


def test_k_and_v_caches_must_agree() -> None:
    dev = device()
    k_cache = torch.randn(2, BS, 1, 64, dtype=torch.float16, device=dev)
    tables = torch.zeros(1, 1, dtype=torch.int32, device=dev)
    lens = torch.ones(1, dtype=torch.int32, device=dev)
    with pytest.raises(TypeError, match="both caches alike"):
        paged_decode_triton(torch.randn(1, 2, 64, device=dev), k_cache, k_cache.float(), tables, lens, 0.1)
