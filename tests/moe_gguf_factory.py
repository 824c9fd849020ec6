"""Tiny random-weight mixture-of-experts GGUFs, written with gguf's writer, that llama.cpp and the torch engine
both load (tests/engine_model/test_moe_conformance.py).

Architectures and what each adds to the Llama block (llama.cpp's llama-model.cpp / build_moe_ffn):
- "llama" with expert_count: Mixtral.  Router ffn_gate_inp (E, H), stacked experts ffn_{gate,up}_exps (E, F, H)
  and ffn_down_exps (E, H, F); softmax, top-k, weights renormalised; Q/K rows in llama.cpp's reordered layout.
- "qwen2moe": Q/K/V biases, experts of expert_feed_forward_length, weights not renormalised, and a shared expert
  ffn_{gate,up,down}_shexp of expert_shared_feed_forward_length gated by sigmoid(ffn_gate_inp_shexp . x).
- "qwen3moe": RMSNorm of each Q and K head (attn_q_norm / attn_k_norm, head_dim) before RoPE, no biases,
  weights renormalised.
Numpy shapes here are (out, in) and (E, out, in); GGUF stores the dimensions reversed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.gguf_factory import write_tokenizer


def write_tiny_moe(
    path: str | Path,
    architecture: str = "llama",
    *,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    n_experts: int = 4,
    n_experts_used: int = 2,
    expert_ffn: int = 48,
    shared_ffn: int = 80,
    weight_type: str = "F32",
    seed: int = 0,
    context_length: int = 256,
) -> Path:
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    if architecture not in ("llama", "qwen2moe", "qwen3moe"):
        raise ValueError(f"no tiny MoE for {architecture!r}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = hidden // n_heads
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name(f"tiny-{architecture}-moe")
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(expert_ffn if architecture == "llama" else 4 * hidden)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_expert_count(n_experts)
    w.add_expert_used_count(n_experts_used)
    if architecture != "llama":
        w.add_expert_feed_forward_length(expert_ffn)
    if architecture == "qwen2moe":
        w.add_expert_shared_feed_forward_length(shared_ffn)
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[weight_type])
    tokens = write_tokenizer(w, "spm")

    def add(name: str, shape: tuple[int, ...], scale: float = 0.05) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("norm.weight"):
            data = (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)
        if weight_type == "F32" or len(shape) < 2 or "norm" in name or "gate_inp" in name:
            w.add_tensor(name, data)
        elif weight_type == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, T.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=T.Q8_0)

    add("token_embd.weight", (len(tokens), hidden))
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,))
        add(p + "attn_q.weight", (n_heads * head_dim, hidden))
        add(p + "attn_k.weight", (n_kv_heads * head_dim, hidden))
        add(p + "attn_v.weight", (n_kv_heads * head_dim, hidden))
        if architecture == "qwen2moe":
            for part, rows in (("q", n_heads), ("k", n_kv_heads), ("v", n_kv_heads)):
                add(p + f"attn_{part}.bias", (rows * head_dim,), scale=0.5)
        if architecture == "qwen3moe":
            add(p + "attn_q_norm.weight", (head_dim,))
            add(p + "attn_k_norm.weight", (head_dim,))
        add(p + "attn_output.weight", (hidden, n_heads * head_dim))
        add(p + "ffn_norm.weight", (hidden,))
        add(p + "ffn_gate_inp.weight", (n_experts, hidden), scale=0.5)  # a spread of router probabilities
        add(p + "ffn_gate_exps.weight", (n_experts, expert_ffn, hidden))
        add(p + "ffn_up_exps.weight", (n_experts, expert_ffn, hidden))
        add(p + "ffn_down_exps.weight", (n_experts, hidden, expert_ffn))
        if architecture == "qwen2moe":
            add(p + "ffn_gate_inp_shexp.weight", (hidden,), scale=0.5)
            add(p + "ffn_gate_shexp.weight", (shared_ffn, hidden))
            add(p + "ffn_up_shexp.weight", (shared_ffn, hidden))
            add(p + "ffn_down_shexp.weight", (hidden, shared_ffn))
    add("output_norm.weight", (hidden,))
    add("output.weight", (len(tokens), hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
