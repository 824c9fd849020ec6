"""The Llama family: Llama 2/3, Mistral, Qwen2/2.5, SmolLM2 (and Qwen3, whose QK-norm is a config flag of the
shared attention: see qwen3.py).  The model is the shared pre-norm decoder of layers.py:

embedding -> N x [RMSNorm -> GQA attention over the paged KV cache -> residual,
                  RMSNorm -> SwiGLU MLP -> residual] -> final RMSNorm -> lm head.

Mistral is the same network with a sliding window on every layer when its config sets one (Mistral 7B v0.1:
4096 tokens; v0.2 and later have none).  Each residual add is fused with the RMSNorm after it
(KernelSet.add_rms_norm: one Triton kernel on CUDA).

The names LlamaConfig / LlamaModel / RMSNorm / Attention / MLP / Block stay importable from here: other parts
(tensor parallelism, mixture-of-experts, scripts/gpu_bench.py) build on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.torch_engine.models.layers import MLP, Attention, Block, DecoderConfig, DecoderModel, RMSNorm

if TYPE_CHECKING:  # pragma: no cover
    from backends.modelspec import ModelSpec

__all__ = ["ARCHITECTURES", "Attention", "Block", "LlamaConfig", "LlamaModel", "MLP", "MODEL", "RMSNorm", "config"]

ARCHITECTURES = ("llama", "mistral", "qwen2")
GGUF_QK_REORDERED = {"llama": True, "mistral": True, "qwen2": False}  # llama.cpp's converter permuted Q/K rows

LlamaConfig = DecoderConfig


class LlamaModel(DecoderModel):
    block = Block


MODEL = LlamaModel


def config(spec: ModelSpec, base: DecoderConfig) -> DecoderConfig:
    """The shared config read from the spec is the whole story; Mistral's window (spec.sliding_window, 0 when
    its config has none) applies to every layer."""
    return base
