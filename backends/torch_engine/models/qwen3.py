"""Qwen3 (dense): the Llama-family decoder with QK-norm, an RMSNorm over each head of Q and of K before RoPE,
and head_dim given by the file (128 for every size, not hidden / heads).  No Q/K/V biases, unlike Qwen2.
Rotate-half RoPE in GGUF files too (llama.cpp's converter does not permute Qwen's Q/K rows)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from backends.torch_engine.models.layers import DecoderConfig
from backends.torch_engine.models.llama import LlamaModel

if TYPE_CHECKING:  # pragma: no cover
    from backends.modelspec import ModelSpec

ARCHITECTURES = ("qwen3",)
GGUF_QK_REORDERED = {"qwen3": False}
MODEL = LlamaModel


def config(spec: ModelSpec, base: DecoderConfig) -> DecoderConfig:
    return dataclasses.replace(base, qk_norm=True)
