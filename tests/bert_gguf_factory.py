"""A tiny random-weight BERT GGUF (the architecture of nomic-embed / bge / all-MiniLM embedding models), written
with gguf's own writer, that llama.cpp runs in its embedding mode.  No embedding model ships in a PyPI wheel we
know of, so the tests of embedding-model recognition, chat refusal and llama.cpp's encoder path use this.

Tensors and keys as llama.cpp's BERT loader reads them (llama-model.cpp, LLM_ARCH_BERT): token, token-type
and position embeddings with a LayerNorm, then per layer Q/K/V/output projections with biases, a post-attention
LayerNorm, a GELU MLP (up/down with biases) and a post-MLP LayerNorm.  A WordPiece ("bert") vocabulary of the
special tokens, lower-case letters and a few words.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "paris", "france", "capital", "is", "of"]  # unique: no single letters


def write_tiny_bert(
    path: str | Path,
    *,
    n_layers: int = 2,
    hidden: int = 32,
    n_heads: int = 2,
    ffn: int = 64,
    ctx: int = 128,
    pooling: int = 1,
    seed: int = 0,
) -> Path:
    """pooling: llama_pooling_type (1 mean, 2 cls)."""
    import gguf

    rng = np.random.default_rng(seed)
    # llama.cpp's WordPiece vocabulary as its converter writes it: a word's first piece with "▁" in front, the
    # pieces that continue a word bare (Hugging Face's "##x" is "x" here)
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"\u2581{c}" for c in letters] + list(letters)
    tokens += [f"\u2581{word}" for word in WORDS]
    types = [3, 2, 3, 3, 3] + [1] * (len(tokens) - 5)
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("tiny-bert-embed")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_block_count(n_layers)
    w.add_head_count(n_heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_unk_token_id(1)
    w.add_pad_token_id(0)
    w.add_bos_token_id(2)  # [CLS]: llama.cpp reads the class token as BOS
    w.add_eos_token_id(3)
    w.add_sep_token_id(3)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)

    def t(name: str, *shape: int, scale: float = 0.05) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name: str, size: int) -> None:
        w.add_tensor(f"{name}.weight", np.ones(size, dtype=np.float32))
        w.add_tensor(f"{name}.bias", np.zeros(size, dtype=np.float32))

    t("token_embd.weight", vocab, hidden, scale=1.0)
    t("token_types.weight", 2, hidden)
    t("position_embd.weight", ctx, hidden, scale=0.5)
    norm("token_embd_norm", hidden)
    for i in range(n_layers):
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{proj}.weight", hidden, hidden, scale=0.2)
            t(f"blk.{i}.{proj}.bias", hidden)
        norm(f"blk.{i}.attn_output_norm", hidden)
        t(f"blk.{i}.ffn_up.weight", ffn, hidden, scale=0.2)
        t(f"blk.{i}.ffn_up.bias", ffn)
        t(f"blk.{i}.ffn_down.weight", hidden, ffn, scale=0.2)
        t(f"blk.{i}.ffn_down.bias", hidden)
        norm(f"blk.{i}.layer_output_norm", hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
