"""What each engine supports, in one place (the planner and the torch engine both read it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from hwprobe.shape import ModelShape

# Architectures (GGUF general.architecture names) the torch engine implements: the keys of
# backends/torch_engine/models/__init__.py's FAMILIES (a test checks that the two lists agree; hwprobe may not
# import the engine).  Mistral 7B is "llama" in GGUF and MistralForCausalLM maps to "llama" for HF folders.
TORCH_ENGINE_ARCHITECTURES = ("gemma3", "llama", "mistral", "phi3", "qwen2", "qwen3")
# Mixture-of-experts architectures the torch engine implements (models/moe.py: Mixtral is "llama" with experts).
# It runs them when asked (--backend torch) but the planner does not choose it for them yet: their experts load
# dense (no quantization), and the expert offload with its device cache has not been measured on a GPU.
TORCH_ENGINE_MOE_ARCHITECTURES = ("llama", "qwen2moe", "qwen3moe")

# What the torch engine can run on a GPU.  Its loader quantizes each projection as it reads it (int8 / int4 / fp8
# round-to-nearest, backends/torch_engine/loader.py), or keeps a GGUF's own quantized blocks
# (weight_map.REPACK_KIND; "GGUF"), so a quantized plan never needs the full-precision bytes on the device.  Several
# GPUs only by tensor parallelism (backends/torch_engine/tp: one rank per GPU), never by a layer split.
TORCH_ENGINE_RUNNABLE_FORMATS = ("bf16", "fp16", "GGUF", "W8A16", "FP8", "W4A16+attn8", "W4A16")
TORCH_ENGINE_MAX_GPUS = 8

# GGUF tokenizers the torch engine builds: byte-level BPE ("gpt2") with these pre-tokenizers
# (backends/torch_engine/tokenizer.py implements each), and SentencePiece "llama" vocabularies (Llama 1/2,
# Mistral: backends/torch_engine/spm_tokenizer.py).
TORCH_ENGINE_GGUF_PRE_TOKENIZERS = ("smollm", "llama-bpe", "llama3", "qwen2", "gpt2", "default")
TORCH_ENGINE_GGUF_SPM = "llama"

# The torch engine needs a CUDA build that targets the card: PyTorch's current wheels start at Turing (sm_75).
TORCH_ENGINE_MIN_CC = (7, 5)

# FP8 (e4m3) matmuls are native from Ada / Hopper (compute capability 8.9) on.
FP8_MIN_CC = (8, 9)

# bfloat16 arithmetic is native from Ampere (8.0) on; older cards get float16.
BF16_MIN_CC = (8, 0)


def torch_engine_refusal(shape: ModelShape) -> str | None:
    """Why the torch engine cannot run this model, or None when it can (architecture, experts, tokenizer)."""
    if shape.n_experts:
        if shape.architecture not in TORCH_ENGINE_MOE_ARCHITECTURES:
            return f"the torch engine does not implement {shape.architecture} mixture-of-experts models"
        return (
            f"the planner sends mixture-of-experts models ({shape.n_experts} experts) to the torch engine only "
            "when asked (--backend torch): it loads their experts dense, unquantized"
        )
    if shape.architecture not in TORCH_ENGINE_ARCHITECTURES:
        return f"the torch engine does not implement {shape.architecture}"
    model, _, pre = shape.tokenizer.partition("/")
    if (
        model
        and model not in ("hf", TORCH_ENGINE_GGUF_SPM)
        and (model != "gpt2" or pre not in TORCH_ENGINE_GGUF_PRE_TOKENIZERS)
    ):
        return f"the torch engine does not build the {shape.tokenizer} tokenizer"
    return None
