"""Model shapes written by hand from each model's config.json (the planner never needs the files)."""

from hwprobe.shape import ModelShape

LLAMA2_7B = ModelShape("Llama-2-7B", "llama", 32, 4096, 32, 32, 128, 11008, 32000, 4096)
LLAMA2_13B = ModelShape("Llama-2-13B", "llama", 40, 5120, 40, 40, 128, 13824, 32000, 4096)
LLAMA2_70B = ModelShape("Llama-2-70B", "llama", 80, 8192, 64, 8, 128, 28672, 32000, 4096)
LLAMA3_8B = ModelShape("Llama-3-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192)
MISTRAL_7B = ModelShape("Mistral-7B-v0.1", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768)
QWEN25_14B = ModelShape("Qwen2.5-14B", "qwen2", 48, 5120, 40, 8, 128, 13824, 152064, 32768)
MIXTRAL_8X7B = ModelShape(
    "Mixtral-8x7B", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768, n_experts=8, n_experts_used=2
)

ALL = (LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LLAMA3_8B, MISTRAL_7B, QWEN25_14B, MIXTRAL_8X7B)


def q4_0_llama_spec(name: str, n_layers: int, hidden: int, ffn: int):
    """A Llama-2-shaped Q4_0 GGUF as a ModelSpec with no file behind it: every projection Q4_0 (18 bytes per 32
    weights), a Q6_K head, F32 norms, 32000 tokens, untied head, 128-wide heads without GQA."""
    import dataclasses

    from backends.modelspec import TensorSpec
    from tests.fakes import fake_spec

    def t(name: str, rows: int, cols: int, qtype: str = "Q4_0") -> TensorSpec:
        n = rows * cols
        return TensorSpec(name, qtype, (cols, rows), int(n * {"Q4_0": 18 / 32, "Q6_K": 210 / 256, "F32": 4}[qtype]), n)

    tensors = [
        t("token_embd.weight", 32000, hidden),
        t("output.weight", 32000, hidden, "Q6_K"),
        t("output_norm.weight", 1, hidden, "F32"),
    ]
    for i in range(n_layers):
        b = f"blk.{i}."
        tensors += [
            t(b + n, hidden, hidden) for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
        ]
        tensors += [
            t(b + "ffn_gate.weight", ffn, hidden),
            t(b + "ffn_up.weight", ffn, hidden),
            t(b + "ffn_down.weight", hidden, ffn),
            t(b + "attn_norm.weight", 1, hidden, "F32"),
            t(b + "ffn_norm.weight", 1, hidden, "F32"),
        ]
    return dataclasses.replace(
        fake_spec(name=name),
        format="gguf",
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=hidden // 128,
        n_kv_heads=hidden // 128,
        head_dim=128,
        ffn_size=ffn,
        vocab_size=32000,
        context_length=4096,
        file_type="Q4_0",
        tensors=tuple(tensors),
        param_count=sum(x.n_elements for x in tensors),
        tied_embeddings=False,
        tokenizer_model="llama",
        tokenizer_pre="",
    )
