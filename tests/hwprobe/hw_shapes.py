"""Model shapes written by hand from each model's config.json (the planner never needs the files)."""

from hwprobe.shape import ModelShape

LLAMA2_7B = ModelShape("Llama-2-7B", "llama", 32, 4096, 32, 32, 128, 11008, 32000, 4096)
LLAMA2_13B = ModelShape("Llama-2-13B", "llama", 40, 5120, 40, 40, 128, 13824, 32000, 4096)
LLAMA2_70B = ModelShape("Llama-2-70B", "llama", 80, 8192, 64, 8, 128, 28672, 32000, 4096)
LLAMA3_8B = ModelShape("Llama-3-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192)
MISTRAL_7B = ModelShape("Mistral-7B-v0.1", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768)
QWEN25_14B = ModelShape("Qwen2.5-14B", "qwen2", 48, 5120, 40, 8, 128, 13824, 152064, 32768)
MIXTRAL_8X7B = ModelShape("Mixtral-8x7B", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768, n_experts=8,
                          n_experts_used=2)

ALL = (LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LLAMA3_8B, MISTRAL_7B, QWEN25_14B, MIXTRAL_8X7B)
