"""Tiny random-weight GGUFs of each dense architecture the torch engine runs, written with gguf's own writer, for
conformance tests against llama.cpp (tests/conformance/).  Llama and Qwen2 come from tests/gguf_factory.py;
this module writes the architectures whose tensors or metadata differ:

- "qwen3": QK-norm tensors (attn_q_norm / attn_k_norm), head_dim from attention.key_length (not hidden / heads).
- "gemma3": QK-norm, sandwich norms (post_attention_norm, post_ffw_norm), sliding window with the 5:1 pattern
  (6 layers: 0-4 slide, 5 is global), global RoPE base 1e6.  Norm weights are written as llama.cpp's
  converter stores them (1 + w already added), near 1.
- "phi3": fused attn_qkv and ffn_up (gate and up, 2 x ffn rows), optional partial rotary (rope_dim).

All use SmolLM2's byte-level BPE tokenizer (copied from the starter model), which llama.cpp accepts for any
architecture, so prompts tokenize the same in both engines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.gguf_factory import write_tokenizer

ARCHS = ("qwen3", "gemma3", "phi3")


def write_tiny_arch(
    path: str | Path,
    architecture: str,
    *,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int | None = None,
    ffn: int = 128,
    context_length: int = 256,
    rope_base: float = 10000.0,
    sliding_window: int = 0,
    rope_dim: int | None = None,
    weight_type: str = "F32",
    tokenizer: str = "bpe",
    longrope_original: int = 0,
    seed: int = 0,
) -> Path:
    """Write a random-weight `architecture` GGUF to `path` (weight_type "F32", "F16" or "Q8_0").
    longrope_original (phi3): write LongRoPE short and long factors for that original context, and an
    attention factor, as llama.cpp's converter does for Phi-3-mini-128k."""
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    if architecture not in ARCHS:
        raise ValueError(f"write_tiny_arch writes {', '.join(ARCHS)}, not {architecture!r}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = head_dim or hidden // n_heads
    w = gguf.GGUFWriter(str(path), architecture)
    # not "phi3" in the name: llama.cpp then sets attributes of Phi-3's own special tokens, which this
    # vocabulary lacks (llama-vocab.cpp, by model name), and fails with "unordered_map::at"
    w.add_name(f"tiny-{architecture.replace('phi', 'p')}")
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(rope_dim or head_dim)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    if longrope_original:
        w.add_rope_scaling_orig_ctx_len(longrope_original)
        w.add_rope_scaling_attn_factors(1.19)
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[weight_type])
    vocab = len(write_tokenizer(w, tokenizer))

    def add(name: str, shape: tuple[int, ...], scale: float = 0.02) -> None:
        if name.endswith("norm.weight"):
            data = (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)
        else:
            data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if weight_type == "F32" or len(shape) < 2:
            w.add_tensor(name, data)
        elif weight_type == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, T.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=T.Q8_0)

    q_rows, kv_rows = n_heads * head_dim, n_kv_heads * head_dim
    # numpy shapes are (out_features, in_features); GGUF stores them reversed.  Gemma's embedding is scaled by
    # sqrt(hidden) in the model, and it is also the head: drawn larger so that the logits span a few units.
    add("token_embd.weight", (vocab, hidden), scale=0.1 if architecture == "gemma3" else 0.02)
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,))
        if architecture == "phi3":
            add(p + "attn_qkv.weight", (q_rows + 2 * kv_rows, hidden))
        else:
            add(p + "attn_q.weight", (q_rows, hidden))
            add(p + "attn_k.weight", (kv_rows, hidden))
            add(p + "attn_v.weight", (kv_rows, hidden))
            add(p + "attn_q_norm.weight", (head_dim,))
            add(p + "attn_k_norm.weight", (head_dim,))
        add(p + "attn_output.weight", (hidden, q_rows))
        add(p + "ffn_norm.weight", (hidden,))
        if architecture == "phi3":
            add(p + "ffn_up.weight", (2 * ffn, hidden))
        else:
            add(p + "ffn_gate.weight", (ffn, hidden))
            add(p + "ffn_up.weight", (ffn, hidden))
        add(p + "ffn_down.weight", (hidden, ffn))
        if architecture == "gemma3":
            add(p + "post_attention_norm.weight", (hidden,))
            add(p + "post_ffw_norm.weight", (hidden,))
    if longrope_original:  # frequency divisors per rotated pair: short near 1, long up to ~40
        pairs = (rope_dim or head_dim) // 2
        w.add_tensor("rope_factors_short.weight", (1 + rng.random(pairs) * 0.5).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", (1 + rng.random(pairs) * 40).astype(np.float32))
    add("output_norm.weight", (hidden,))
    if architecture != "gemma3":  # Gemma ties its head to the embedding
        add("output.weight", (vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
