"""Phi-3 / Phi-3.5 / Phi-4 (dense): the shared pre-norm decoder (SwiGLU, rotate-half RoPE) with its own tensor
layout and RoPE options.

- Q/K/V come as one tensor (GGUF attn_qkv, HF qkv_proj) and gate/up as one (GGUF ffn_up with 2 x ffn rows, HF
  gate_up_proj, gate first): exactly the merged qkv_proj / gate_up_proj of layers.py, so they load as they are
  (backends/weight_map.py ARCH_*_NAMES); a GGUF with separate attn_q/k/v loads through the common names.
- Partial rotary (Phi-4-mini: 3/4 of each head): GGUF `phi3.rope.dimension_count`, HF partial_rotary_factor.
- LongRoPE (Phi-3-mini-128k, Phi-3.5): the frequencies are divided by the file's short factors (GGUF
  rope_factors_short.weight, HF rope_scaling.short_factor) when the engine's context (LoadOptions.n_ctx) is
  within the original training length (4096), else by the long ones: llama.cpp's rule, fixed at load time
  (Hugging Face switches per forward by the current length).  cos and sin are multiplied by the attention
  factor (GGUF rope.scaling.attn_factor; HF sqrt(1 + ln(s) / ln(L0)) with s = max positions / L0).
- Sliding window: Phi-3-mini's config names 2047, but llama.cpp turns Phi's sliding window off ("currently
  disabled", llama.cpp #13676) and so does this engine, so both backends compute the same thing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from backends.torch_engine.models.layers import DecoderConfig
from backends.torch_engine.models.llama import LlamaModel

if TYPE_CHECKING:  # pragma: no cover
    from backends.modelspec import ModelSpec

ARCHITECTURES = ("phi3",)
GGUF_QK_REORDERED = {"phi3": False}
MODEL = LlamaModel


def config(spec: ModelSpec, base: DecoderConfig) -> DecoderConfig:
    rope_dim = 0
    scaling = dict(base.rope_scaling)
    short: tuple[float, ...] = ()
    long: tuple[float, ...] = ()
    original, attn_factor = 0, 1.0
    hf = spec.metadata.get("config")
    if isinstance(hf, dict):
        partial = hf.get("partial_rotary_factor")
        if isinstance(partial, (int, float)) and 0 < partial < 1:
            rope_dim = int(spec.head_dim * partial)
        kind = scaling.get("type") or scaling.get("rope_type")
        if kind in ("longrope", "su"):
            short = tuple(float(f) for f in scaling.get("short_factor") or ())
            long = tuple(float(f) for f in scaling.get("long_factor") or ())
            original = int(
                scaling.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings") or 0
            )
            attn_factor = _hf_attn_factor(scaling, spec.context_length, original)
            scaling = {}
    else:
        dims = spec.metadata.get("phi3.rope.dimension_count")
        rope_dim = int(dims) if isinstance(dims, int) and 0 < dims < spec.head_dim else 0
        if any(t.name == "rope_factors_long.weight" for t in spec.tensors):  # the loader reads the factors
            original = int(spec.metadata.get("phi3.rope.scaling.original_context_length") or spec.context_length)
        attn_factor = float(spec.metadata.get("phi3.rope.scaling.attn_factor") or 1.0)
    return dataclasses.replace(
        base,
        rope_dim=rope_dim,
        rope_scaling=scaling,
        rope_factors=short,
        rope_factors_long=long,
        rope_original_ctx=original,
        rope_attn_factor=attn_factor,
        sliding_window=0,
        window_layers=(),
    )


def _hf_attn_factor(scaling: dict, max_positions: int, original: int) -> float:
    given = scaling.get("attention_factor")
    if isinstance(given, (int, float)):
        return float(given)
    if not original or max_positions <= original:
        return 1.0
    return math.sqrt(1 + math.log(max_positions / original) / math.log(original))
