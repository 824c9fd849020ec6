"""Gated MLP activations: SwiGLU's silu(gate) * up and GeGLU's gelu_tanh(gate) * up (Gemma), where the input
holds [gate | up] along the last dimension.  gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).

The model merges the gate and up projections into one matmul, so the op takes their concatenated output.
"""

from __future__ import annotations

import torch


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: (num_tokens, 2 * ffn) -> (num_tokens, ffn), computed in float32."""
    gate, up = x.float().chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """Fast plain-torch path in x's dtype (silu is computed in float32 internally by torch on CPU/CUDA)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def gelu_tanh_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: (num_tokens, 2 * ffn) -> (num_tokens, ffn), the tanh formula written out, in float64."""
    gate, up = x.double().chunk(2, dim=-1)
    gelu = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3)))
    return (gelu * up).to(x.dtype)


def gelu_tanh_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """Fast plain-torch path (torch's gelu with approximate="tanh"), in x's dtype."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up
