"""Phi-3 / Phi-3.5 / Phi-4 (dense): the shared pre-norm decoder (SwiGLU, rotate-half RoPE) with its own tensor
layout and RoPE options.

- Q/K/V come as one tensor (GGUF attn_qkv, HF qkv_proj) and gate/up as one (GGUF ffn_up with 2 x ffn rows, HF
  gate_up_proj, gate first): exactly the merged qkv_proj / gate_up_proj of layers.py, so they load as they are
  (backends/weight_map.py ARCH_*_NAMES); a GGUF with separate attn_q/k/v loads through the common names.
- Partial rotary (Phi-4-mini: 3/4 of each head): GGUF `phi3.rope.dimension_count`, HF partial_rotary_factor.
- LongRoPE (the 128k variants): the frequencies are divided by the file's short factors (GGUF
  rope_factors_short.weight, HF rope_scaling.short_factor), which is what llama.cpp uses while the context is
  within the original training length (4096 for Phi-3-mini).  Not done here: the long factors llama.cpp
  switches to for longer contexts, and Hugging Face's attention factor on cos/sin (sqrt(1 + ln(s) / ln(L0)),
  which llama.cpp does not apply either).
- Sliding window: Phi-3-mini's config names 2047, but llama.cpp turns Phi's sliding window off ("currently
  disabled", llama.cpp #13676) and so does this engine, so both backends compute the same thing.
"""

from __future__ import annotations

import dataclasses
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
    factors: tuple[float, ...] = ()
    hf = spec.metadata.get("config")
    if isinstance(hf, dict):
        partial = hf.get("partial_rotary_factor")
        if isinstance(partial, (int, float)) and 0 < partial < 1:
            rope_dim = int(spec.head_dim * partial)
        kind = scaling.get("type") or scaling.get("rope_type")
        if kind in ("longrope", "su"):
            factors = tuple(float(f) for f in scaling.get("short_factor") or ())
            scaling = {}
    else:
        dims = spec.metadata.get("phi3.rope.dimension_count")
        rope_dim = int(dims) if isinstance(dims, int) and 0 < dims < spec.head_dim else 0
    return dataclasses.replace(base, rope_dim=rope_dim, rope_scaling=scaling, rope_factors=factors,
                               sliding_window=0, window_layers=())
