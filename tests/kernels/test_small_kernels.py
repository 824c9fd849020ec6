"""RMSNorm (+ fused residual), RoPE (incl. Llama 3 scaling) and the KV-cache write vs their references."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_write_triton import kv_write_reference, kv_write_triton
from kernels.rmsnorm import rms_norm_reference
from kernels.rmsnorm_triton import fused_add_rms_norm_reference, fused_add_rms_norm_triton, rms_norm_triton
from kernels.rope import rope_cos_sin, rope_inv_freq, rope_reference
from kernels.rope_triton import rope_triton
from tests.kernels.conftest import device

pytestmark = pytest.mark.kernels
TOL = {torch.float16: 2e-3, torch.float32: 1e-5}
DTYPES = [torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 64), (15, 576), (17, 100)])
def test_rms_norm(dtype: torch.dtype, tokens: int, hidden: int) -> None:
    x = torch.randn(tokens, hidden, dtype=dtype, device=device())
    r = torch.randn(tokens, hidden, dtype=dtype, device=device())
    w = torch.rand(hidden, dtype=dtype, device=device()) + 0.5
    torch.testing.assert_close(
        rms_norm_triton(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), atol=TOL[dtype], rtol=TOL[dtype]
    )
    out, summed = fused_add_rms_norm_triton(x, r, w, 1e-6)
    want_out, want_sum = fused_add_rms_norm_reference(x, r, w, 1e-6)
    torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)
    torch.testing.assert_close(out, want_out, atol=TOL[dtype], rtol=TOL[dtype])


def test_rms_norm_rejects_bad_weight() -> None:
    with pytest.raises(ValueError, match="does not match hidden"):
        rms_norm_triton(torch.randn(2, 8, device=device()), torch.ones(9, device=device()), 1e-6)


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "tokens,heads,kv_heads,head_dim,scaling",
    [
        (1, 4, 4, 64, None),
        (16, 9, 3, 64, None),
        (17, 8, 1, 128, LLAMA3),
        (3, 3, 1, 32, {"type": "linear", "factor": 4}),
    ],
)
def test_rope(dtype, tokens, heads, kv_heads, head_dim, scaling) -> None:
    positions = torch.randint(0, 20000, (tokens,))
    cos, sin = rope_cos_sin(positions, rope_inv_freq(head_dim, 500000.0, scaling))
    q = torch.randn(tokens, heads, head_dim, dtype=dtype)
    k = torch.randn(tokens, kv_heads, head_dim, dtype=dtype)
    want_q, want_k = rope_reference(q, k, cos, sin)
    dev = device()
    got_q, got_k = rope_triton(q.to(dev), k.to(dev), cos.to(dev), sin.to(dev))
    torch.testing.assert_close(got_q.cpu(), want_q, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(got_k.cpu(), want_k, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,kv_heads,head_dim", [(1, 1, 64), (17, 3, 64), (5, 8, 128)])
def test_kv_write(dtype, tokens, kv_heads, head_dim) -> None:
    dev = device()
    k_cache = torch.zeros(6, 16, kv_heads, head_dim, dtype=dtype, device=dev)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(6 * 16)[:tokens].to(dev)
    slots[0] = -1  # a padding token writes nothing
    key = torch.randn(tokens, kv_heads, head_dim, dtype=dtype, device=dev)
    value = torch.randn_like(key)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    kv_write_reference(key, value, want_k, want_v, slots)
    kv_write_triton(key, value, k_cache, v_cache, slots.to(torch.int32))
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,ffn", [(1, 64), (17, 1536), (3, 100)])
def test_silu_and_mul(dtype, tokens, ffn) -> None:
    from kernels.activation import silu_and_mul_reference
    from kernels.activation_triton import silu_and_mul_triton

    x = torch.randn(tokens, 2 * ffn, dtype=dtype, device=device()) * 3
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_reference(x), atol=TOL[dtype], rtol=TOL[dtype])


def test_dispatch_triton_set_runs_the_ops() -> None:
    dispatch = pytest.importorskip("kernels.dispatch")
    if "triton" not in dispatch.available():
        pytest.skip("kernels/dispatch.py has no triton set")
    ks, ref = dispatch.kernel_set("triton"), dispatch.kernel_set("reference")
    x = torch.randn(2, 5, 64, device=device())  # leading dims are flattened by the Triton launchers
    w = torch.rand(64, device=device())
    torch.testing.assert_close(ks.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ks.silu_and_mul(x), ref.silu_and_mul(x), atol=1e-5, rtol=1e-5)
