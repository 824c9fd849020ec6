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


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: (num_tokens, hidden) -> (normed, x + residual), both in x's dtype: the residual stream the
    next layer adds to, and its RMSNorm (the Triton kernel does both in one pass over the row)."""
    summed = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_reference(summed, weight, eps), summed


def fused_add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as fused_add_rms_norm_reference: the add (one rounding to x's dtype, as a bf16 `x + r`
    does), then rms_norm_torch."""
    summed = x + residual
    return rms_norm_torch(summed, weight, eps), summed


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Fast plain-torch path, computed in float32.  On CUDA torch's fused rms_norm kernel.  On CPU torch 2.13
    runs rms_norm as six separate small ops, but has a fused layer_norm kernel, and RMSNorm(x) is LayerNorm of
    [x, -x] cut to its first half: that vector's mean is 0 and its variance mean(x^2), so the kernel computes
    x / sqrt(mean(x^2) + eps) * weight in float32 (bf16 input read as is).  One starter-model norm at batch 1:
    11.8 vs 18.6 us, 61 of them a decode step; the result equals rms_norm's bit for bit at 1 and 16 rows and
    within one bf16 rounding at 512."""
    if x.is_cuda:
        out = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps)
        return out.to(x.dtype)
    hidden = x.shape[-1]
    doubled = torch.cat([x, -x], dim=-1)
    out = torch.nn.functional.layer_norm(doubled, (2 * hidden,), _padded_weight(weight), None, eps)
    return out[..., :hidden].to(x.dtype)


def _padded_weight(weight: torch.Tensor) -> torch.Tensor:
    """[weight, 0] in float32, kept on the weight tensor itself (norm weights are parameters that live as long
    as the model; building it per call would cost two of the ops saved).  Rebuilt if the weight changed."""
    try:
        version = weight._version
    except RuntimeError:  # an inference-mode tensor keeps no version counter
        version = -1
    cached = getattr(weight, "_hearth_padded", None)
    if cached is None or cached[0] != version:
        padded = torch.cat(
            [weight.detach().float(), torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)]
        )
        cached = (version, padded)
        weight._hearth_padded = cached
    return cached[1]
