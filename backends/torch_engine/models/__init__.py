"""Plain nn.Module model definitions; transforms (quantization, offload, ...) are applied to them afterwards.

One module per architecture family, all built from the shared layers in layers.py (RMSNorm, attention over the
paged KV cache with QK-norm / sliding window / partial rotary options, the gated MLP, the decoder loop):

| module    | architectures (GGUF general.architecture)  | what is its own                                  |
|-----------|--------------------------------------------|--------------------------------------------------|
| llama.py  | llama, mistral, qwen2                      | nothing: the shared pre-norm decoder             |
| qwen3.py  | qwen3                                      | QK-norm                                          |
| gemma3.py | gemma3                                     | sandwich norms, GeGLU, embedding scale, local and |
|           |                                            | global RoPE, the sliding-window pattern           |
| phi3.py   | phi3 (Phi-3, Phi-3.5, Phi-4)               | fused QKV / gate-up tensors, partial rotary,      |
|           |                                            | LongRoPE                                          |
| moe.py    | llama with experts (Mixtral), qwen2moe,    | the MLP a sparse MoE (router, grouped experts,    |
|           | qwen3moe                                   | shared expert); any model with experts loads      |
|           |                                            | through ../moe_loader.py, not FAMILIES            |

Adding an architecture (dense, attention + gated MLP):
1. Write `models/NAME.py` with `ARCHITECTURES` (the GGUF names it runs), `GGUF_QK_REORDERED` (arch -> whether
   llama.cpp's converter permuted Q/K rows for interleaved RoPE: True only for the llama kind), `MODEL` (a
   layers.DecoderModel subclass; set `block` when the block differs from layers.Block) and
   `config(spec, base) -> DecoderConfig`, which adjusts the shared config read from the ModelSpec
   (loader.base_config) with what the family needs; optional `HF_NORM_OFFSET` (1.0 where Hugging Face stores
   norm weights as w for a (1 + w) norm and llama.cpp's converter stored 1 + w).
2. Add it to FAMILIES below, and its tensor names where they differ from Llama's to backends/weight_map.py
   (ARCH_GGUF_NAMES / ARCH_HF_NAMES), and the architecture to hwprobe/support.py's TORCH_ENGINE_ARCHITECTURES
   (a test checks that both lists agree).
3. Add a tiny random-weight GGUF of it to tests/conformance/ (tests/arch_factory.py writes them): llama.cpp's
   logits and the torch engine's must agree.

This package imports nothing heavy on its own: a family module is imported when a model of it is loaded.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# GGUF architecture name -> family module in this package
FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
}


def family(architecture: str) -> ModuleType:
    """The family module that builds `architecture` (KeyError when none does)."""
    return importlib.import_module(f"{__name__}.{FAMILIES[architecture]}")
