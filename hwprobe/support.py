"""What each engine supports, in one place (the planner and the torch engine both read it)."""

from __future__ import annotations

# Architectures (GGUF general.architecture names) the torch engine implements.
TORCH_ENGINE_ARCHITECTURES = ("llama", "mistral", "qwen2")

# The torch engine needs a CUDA build that targets the card: PyTorch's current wheels start at Turing (sm_75).
TORCH_ENGINE_MIN_CC = (7, 5)

# FP8 (e4m3) matmuls are native from Ada / Hopper (compute capability 8.9) on.
FP8_MIN_CC = (8, 9)

# bfloat16 arithmetic is native from Ampere (8.0) on; older cards get float16.
BF16_MIN_CC = (8, 0)
