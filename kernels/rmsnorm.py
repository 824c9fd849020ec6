"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back to x's dtype.

llama.cpp normalises in float32 whatever the weight type, so both paths here do too.
"""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Slow, obvious version.  x: (num_tokens, hidden); weight: (hidden,)."""
    xf = x.float()
    variance = (xf * xf).mean(dim=-1, keepdim=True)
    return (xf / torch.sqrt(variance + eps) * weight.float()).to(x.dtype)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Fast plain-torch path: torch's fused rms_norm kernel in float32."""
    out = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps)
    return out.to(x.dtype)
