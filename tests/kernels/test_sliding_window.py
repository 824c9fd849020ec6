"""Sliding-window paged attention (Gemma 3, Mistral v0.1) and GeGLU: the fast torch path against the reference,
and both against properties that do not depend on either (a window as long as the context changes nothing; a
window of one attends to the query's own value only)."""

from __future__ import annotations

import pytest
import torch

from kernels import activation, attention
from tests.kernels.conftest import device
from tests.kernels.test_torch_ops import CASES, _paged_case

SCALE = 32**-0.5


@pytest.mark.parametrize("case", ["decode-1-on-blocks", "one-decode-and-a-chunk", "chunk-on-prefix", "mixed"])
@pytest.mark.parametrize("window", [1, 5, 16, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_windowed_fast_path_matches_reference(case: str, window: int, dtype: torch.dtype) -> None:
    q, k_cache, v_cache, meta = _paged_case(CASES[case], 6, 2, dtype)
    windowed = attention.with_sliding_window(meta, window)
    assert attention.with_sliding_window(meta, window) is windowed  # built once per step and window
    ref = attention.paged_attention_reference(q, k_cache, v_cache, windowed, SCALE)
    out = attention.paged_attention_torch(q, k_cache, v_cache, windowed, SCALE)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    full = attention.paged_attention_reference(q, k_cache, v_cache, meta, SCALE)
    assert not torch.allclose(ref.float(), full.float(), atol=tol)  # every case here has context past the window


@pytest.mark.parametrize("case", ["mixed", "chunk-on-prefix"])
def test_a_window_as_long_as_the_context_changes_nothing(case: str) -> None:
    q, k_cache, v_cache, meta = _paged_case(CASES[case], 4, 2, torch.float32)
    longest = max(meta.context_lens)
    for impl in (attention.paged_attention_reference, attention.paged_attention_torch):
        torch.testing.assert_close(
            impl(q, k_cache, v_cache, attention.with_sliding_window(meta, longest), SCALE),
            impl(q, k_cache, v_cache, meta, SCALE),
            atol=1e-6,
            rtol=1e-6,
        )


def test_a_window_of_one_returns_each_querys_own_value() -> None:
    q, k_cache, v_cache, meta = _paged_case(CASES["mixed"], 4, 2, torch.float32)
    own = v_cache.reshape(-1, *v_cache.shape[2:])[meta.slot_mapping]  # (num_tokens, kv_heads, D): each new token's V
    want = own.repeat_interleave(2, dim=1)  # GQA: heads 0,1 read kv head 0; 2,3 kv head 1
    for impl in (attention.paged_attention_reference, attention.paged_attention_torch):
        got = impl(q, k_cache, v_cache, attention.with_sliding_window(meta, 1), SCALE)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", ["decode-1-on-blocks", "mixed", "chunk-on-prefix", "prefill-17"])
@pytest.mark.parametrize("window", [1, 5, 16, 17, 40])
def test_triton_kernels_honour_the_window(case: str, window: int) -> None:
    """The Triton entry point (decode-only steps: the split decode kernel; others: the prefill kernel) against
    the windowed reference; under TRITON_INTERPRET=1 on CPU."""
    pytest.importorskip("triton")
    from kernels.attention_triton import paged_attention_triton

    q, k_cache, v_cache, meta = _paged_case(CASES[case], 6, 2, torch.float32, device=device())
    windowed = attention.with_sliding_window(meta, window)
    torch.testing.assert_close(
        paged_attention_triton(q, k_cache, v_cache, windowed, SCALE),
        attention.paged_attention_reference(q, k_cache, v_cache, windowed, SCALE),
        atol=1e-4,
        rtol=1e-4,
    )


@pytest.mark.parametrize("window", [1, 16, 17, 33])
def test_triton_decode_splits_wholly_behind_the_window_weigh_nothing(window: int) -> None:
    """One block per split: the splits before the window's first block read nothing and must not disturb the
    merge (max -inf, weight 0)."""
    pytest.importorskip("triton")
    from kernels.attention_triton import paged_decode_triton, step_tables

    q, k_cache, v_cache, meta = _paged_case([(100, 1), (40, 1), (5, 1)], 6, 2, torch.float32, device=device())
    table, seq_lens = step_tables(meta, q.device)
    got = paged_decode_triton(q, k_cache, v_cache, table, seq_lens, SCALE, blocks_per_split=1, window=window)
    want = attention.paged_attention_reference(q, k_cache, v_cache, attention.with_sliding_window(meta, window), SCALE)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n", [1, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_and_mul(n: int, dtype: torch.dtype) -> None:
    x = (torch.randn(n, 2 * 40) * 3).to(dtype)
    ref = activation.gelu_tanh_and_mul_reference(x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(activation.gelu_tanh_and_mul_torch(x).float(), ref.float(), atol=tol, rtol=tol)
    # known values: gelu_tanh(0) = 0, gelu_tanh(1) = 0.841192, gelu_tanh(-3) = -0.003637
    gate_up = torch.tensor([[0.0, 1.0, -3.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(
        activation.gelu_tanh_and_mul_reference(gate_up),
        torch.tensor([[0.0, 1.682384, -0.007274]], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
