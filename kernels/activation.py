"""SwiGLU's gate: silu(gate) * up, where the input holds [gate | up] along the last dimension.

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
