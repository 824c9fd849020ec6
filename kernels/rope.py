"""Rotary position embedding, rotate-half ("NEOX") layout.

For a head vector x of size D and position p, with inv_freq[i] (i < D/2):
    angle_i = p * inv_freq[i]
    out[i]       = x[i] * cos(angle_i) - x[i + D/2] * sin(angle_i)
    out[i + D/2] = x[i + D/2] * cos(angle_i) + x[i] * sin(angle_i)

Llama-family GGUFs store Q/K rows reordered for the interleaved-pair layout; the loader undoes that reorder,
so every model hearth runs uses this one layout (see backends/torch_engine/loader.py).

`inv_freq` already carries any frequency scaling (linear, Llama 3): see `rope_inv_freq`.
"""

from __future__ import annotations

import math

import torch


def rope_inv_freq(
    head_dim: int, base: float, scaling: dict | None = None, freq_factors: torch.Tensor | None = None
) -> torch.Tensor:
    """(head_dim // 2,) float32 inverse frequencies.

    scaling: {"type": "linear", "factor": f} divides every frequency by f; {"type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_context_length"} is Llama 3.1's smooth per-band scaling.
    freq_factors: llama.cpp's `rope_freqs.weight` (Llama 3.1 GGUFs): frequencies are divided by it, which is
    the same Llama 3 scaling precomputed by the converter.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    scaling = scaling or {}
    kind = scaling.get("type") or scaling.get("rope_type")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.double()
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_context_length") or scaling.get("original_max_position_embeddings"))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_ctx / wavelen) - low) / (high - low)
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif kind not in (None, "none", "default"):
        raise ValueError(f"unsupported RoPE scaling {kind!r}")
    return inv_freq.float()


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (num_tokens, 1, head_dim // 2), float32: computed once per step, shared by layers."""
    angle = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    return angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow version, one token and one head at a time in float64.
    q: (num_tokens, num_heads, head_dim); k: (num_tokens, num_kv_heads, head_dim); cos/sin: (num_tokens, 1, D/2)."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        half = x.shape[-1] // 2
        for t in range(x.shape[0]):
            c, s = cos[t, 0].double(), sin[t, 0].double()
            for h in range(x.shape[1]):
                v = x[t, h].double()
                a, b = v[:half], v[half:]
                out[t, h] = torch.cat([a * c - b * s, b * c + a * s]).to(x.dtype)
        return out

    return rotate(q), rotate(k)


def rope_torch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path, same contract as `rope_reference`; math in float32.  Q and K heads are rotated in one go, as
    x * [cos, cos] + roll(x, D/2) * [-sin, sin] (roll turns [a, b] into [b, a]), with the full-width tables
    built once per step (`_full_tables`): at batch 1 on CPU the op count is what costs (12 vs 18 us a layer)."""
    heads = q.shape[1]
    x = torch.cat([q, k], dim=1).float()  # (num_tokens, num_heads + num_kv_heads, head_dim)
    cos_full, sin_signed = _full_tables(cos, sin)
    out = (x * cos_full).addcmul_(x.roll(x.shape[-1] // 2, -1), sin_signed).to(q.dtype)
    return out[:, :heads], out[:, heads:]


def _full_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([cos, cos], [-sin, sin]) along the last dimension, kept on `cos` (the step's table, shared by every
    layer), so only the first layer of a step builds them."""
    cached = getattr(cos, "_hearth_full", None)
    if cached is None or cached[0] is not sin:
        cached = (sin, torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1))
        cos._hearth_full = cached
    return cached[1], cached[2]
