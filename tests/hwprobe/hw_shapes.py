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


# bytes per weight of the GGUF block types these shapes use
TYPE_BYTES = {
    "F32": 4.0,
    "F16": 2.0,
    "Q8_0": 34 / 32,
    "Q6_K": 210 / 256,
    "Q5_K": 176 / 256,
    "Q4_K": 144 / 256,
    "Q4_0": 18 / 32,
    "IQ1_S": 50 / 256,
}


def q4_k_m_type(role: str, layer: int, n_layers: int) -> str:
    """llama.cpp's Q4_K_M mix for a Llama: Q4_K, with Q6_K for attn_v and ffn_down in the first and last eighth of
    the layers and every third one between (its use_more_bits rule), a Q6_K head and a Q4_K embedding."""
    if role == "output":
        return "Q6_K"
    more = layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2
    return "Q6_K" if role in ("attn_v", "ffn_down") and more else "Q4_K"


def gguf_llama_spec(
    name: str,
    n_layers: int,
    hidden: int,
    ffn: int,
    *,
    n_kv_heads: int | None = None,
    vocab: int = 32000,
    file_type: str = "Q4_0",
    types=None,  # (role, layer, n_layers) -> ggml type; role "output" for the head, "token_embd"; default Q4_0/Q6_K
    context_length: int = 4096,
):
    """A Llama-shaped GGUF as a ModelSpec with no file behind it: every tensor's type from `types`, F32 norms,
    an untied head, 128-wide heads (GQA with n_kv_heads)."""
    import dataclasses

    from backends.modelspec import TensorSpec
    from tests.fakes import fake_spec

    kinds = types or (lambda role, layer, n: "Q6_K" if role == "output" else "Q4_0")
    kv = (n_kv_heads or hidden // 128) * 128

    def t(name: str, rows: int, cols: int, qtype: str) -> TensorSpec:
        n = rows * cols
        return TensorSpec(name, qtype, (cols, rows), int(n * TYPE_BYTES[qtype]), n)

    tensors = [
        t("token_embd.weight", vocab, hidden, kinds("token_embd", -1, n_layers)),
        t("output.weight", vocab, hidden, kinds("output", -1, n_layers)),
        t("output_norm.weight", 1, hidden, "F32"),
    ]
    for i in range(n_layers):
        b = f"blk.{i}."
        for role, rows, cols in (
            ("attn_q", hidden, hidden),
            ("attn_k", kv, hidden),
            ("attn_v", kv, hidden),
            ("attn_output", hidden, hidden),
            ("ffn_gate", ffn, hidden),
            ("ffn_up", ffn, hidden),
            ("ffn_down", hidden, ffn),
        ):
            tensors.append(t(b + role + ".weight", rows, cols, kinds(role, i, n_layers)))
        tensors += [t(b + "attn_norm.weight", 1, hidden, "F32"), t(b + "ffn_norm.weight", 1, hidden, "F32")]
    return dataclasses.replace(
        fake_spec(name=name),
        format="gguf",
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=hidden // 128,
        n_kv_heads=kv // 128,
        head_dim=128,
        ffn_size=ffn,
        vocab_size=vocab,
        context_length=context_length,
        file_type=file_type,
        tensors=tuple(tensors),
        param_count=sum(x.n_elements for x in tensors),
        tied_embeddings=False,
        tokenizer_model="llama",
        tokenizer_pre="",
    )


def q4_0_llama_spec(name: str, n_layers: int, hidden: int, ffn: int):
    """A Llama-2-shaped Q4_0 GGUF as a ModelSpec with no file behind it: every projection Q4_0 (18 bytes per 32
    weights), a Q6_K head, F32 norms, 32000 tokens, untied head, 128-wide heads without GQA."""
    return gguf_llama_spec(name, n_layers, hidden, ffn)


def llama3_8b_q4_k_m():
    """Llama-3-8B Q4_K_M as its file holds it (the file most people pull)."""
    return gguf_llama_spec(
        "Llama-3-8B-Q4_K_M",
        32,
        4096,
        14336,
        n_kv_heads=8,
        vocab=128256,
        file_type="Q4_K_M",
        types=q4_k_m_type,
        context_length=8192,
    )


def llama2_13b_q4_k_m():
    return gguf_llama_spec("Llama-2-13B-Q4_K_M", 40, 5120, 13824, file_type="Q4_K_M", types=q4_k_m_type)


def qwen25_7b_q8_0():
    """Qwen2.5-7B-shaped Q8_0 (28 layers, 3584 wide, 4 KV heads, 152064 tokens) as a Llama-architecture spec."""
    return gguf_llama_spec(
        "Qwen2.5-7B-Q8_0",
        28,
        3584,
        18944,
        n_kv_heads=4,
        vocab=152064,
        file_type="Q8_0",
        types=lambda role, layer, n: "Q8_0",
        context_length=32768,
    )
