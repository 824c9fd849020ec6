"""Gemma 3 (text): the shared decoder with Gemma's own block and scaling.

    x = embed(ids) * sqrt(hidden)
    per layer:  x = x + post_attn_norm(attn(input_norm(x)))      (attention with QK-norm)
                x = x + ffn_post_norm(mlp(post_norm(x)))          (GeGLU: gelu_tanh(gate) * up)
    logits = lm_head(norm(x))                                     (tied to the embedding)

- Norms are (1 + w) * x / rms(x).  llama.cpp's converter stores 1 + w in the GGUF, Hugging Face stores w: the
  loader adds HF_NORM_OFFSET to an HF checkpoint's norm weights, so the model always multiplies by the weight.
- Five sliding-window layers (window 512 for the 270M and 1B) to every global one: layer i slides unless
  (i + 1) % 6 == 0 (GGUF `gemma3.attention.sliding_window_pattern` or HF `layer_types` when given).  Sliding
  layers rotate with RoPE base 10000 and no scaling; global layers with the file's base (1e6) and scaling.
- Queries are scaled by query_pre_attn_scalar ** -0.5 (HF); a GGUF does not store it and llama.cpp uses
  head_dim ** -0.5, except (hidden / heads) ** -0.5 for the 62-layer 27B: so do we.
- A final logit softcap when the config has one (Gemma 3's is null; llama.cpp's sliding-window graph never
  applies one).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from backends.torch_engine.models.layers import MLP, Attention, DecoderConfig, DecoderModel, RMSNorm
from kernels.attention import AttentionMetadata
from kernels.dispatch import KernelSet

if TYPE_CHECKING:  # pragma: no cover
    from backends.modelspec import ModelSpec

ARCHITECTURES = ("gemma3",)
GGUF_QK_REORDERED = {"gemma3": False}
HF_NORM_OFFSET = 1.0
SLIDING_PATTERN = 6  # every sixth layer is global
LOCAL_ROPE_BASE = 10000.0


class GemmaBlock(nn.Module):
    """Sandwich-norm block; same forward contract as layers.Block (x: the previous block's output delta,
    residual: the stream before it)."""

    def __init__(self, cfg: DecoderConfig, ops: KernelSet, layer: int = 0) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.attn = Attention(cfg, ops, layer)
        self.attn_post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)  # before the MLP (GGUF ffn_norm)
        self.mlp = MLP(cfg, ops)
        self.ffn_post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.local_rope = bool(cfg.rope_base_local) and cfg.is_sliding(layer)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            h, stream = self.input_norm.forward(x), x
        else:
            h, stream = self.input_norm.add_forward(x, residual)
        a = self.attn_post_norm.forward(self.attn.forward(h, cos, sin, k_cache, v_cache, meta))
        h, stream = self.post_norm.add_forward(a, stream)
        return self.ffn_post_norm.forward(self.mlp.forward(h)), stream


class Gemma3Model(DecoderModel):
    block = GemmaBlock


MODEL = Gemma3Model


def _window_layers(spec: ModelSpec, hf: dict[str, Any]) -> tuple[bool, ...]:
    n = spec.n_layers
    types = hf.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return tuple(t == "sliding_attention" for t in types)
    pattern = spec.metadata.get(
        "gemma3.attention.sliding_window_pattern", hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern"))
    )
    if isinstance(pattern, list) and len(pattern) == n:
        return tuple(bool(v) for v in pattern)
    period = pattern if isinstance(pattern, int) and pattern > 0 else SLIDING_PATTERN
    return tuple(i % period < period - 1 for i in range(n))


def config(spec: ModelSpec, base: DecoderConfig) -> DecoderConfig:
    cfg = spec.metadata.get("config")
    hf: dict[str, Any] = {}
    if isinstance(cfg, dict):
        text = cfg.get("text_config", cfg)
        hf = text if isinstance(text, dict) else {}
    if hf:
        scalar = hf.get("query_pre_attn_scalar") or spec.head_dim
        local_base = float(hf.get("rope_local_base_freq") or LOCAL_ROPE_BASE)
        softcap = float(hf.get("final_logit_softcapping") or 0.0)
    else:
        scalar = spec.hidden_size / spec.n_heads if spec.n_layers == 62 else spec.head_dim
        local_base = float(spec.metadata.get("gemma3.rope.freq_base_swa") or LOCAL_ROPE_BASE)
        softcap = 0.0 if spec.sliding_window else float(spec.metadata.get("gemma3.final_logit_softcapping") or 0.0)
    return dataclasses.replace(
        base,
        qk_norm=True,
        activation="gelu_tanh",
        embed_scale=math.sqrt(spec.hidden_size),
        attn_scale=float(scalar) ** -0.5,
        final_softcap=softcap,
        window_layers=_window_layers(spec, hf) if spec.sliding_window else (),
        rope_base_local=local_base if spec.sliding_window else 0.0,
    )
