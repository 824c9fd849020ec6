"""A model the torch engine loaded (from a GGUF) written back under Hugging Face names: the state dict and the
config.json of the same weights, for tests that check the HF folder path against the GGUF it came from
(tests/conformance/test_dense_archs.py) or build a GPTQ / AWQ folder of a real model
(tests/engine_model/test_gptq_awq_starter.py).  The engine's loaded weights are already in Hugging Face's row
order (the loader undoes llama.cpp's Q/K reorder), so only names, merged projections and norm offsets change."""

from __future__ import annotations

import torch

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def hf_state(model, arch: str) -> dict[str, torch.Tensor]:
    """The engine model's weights under Hugging Face names (Q/K/V and gate/up split back apart, but Phi-3's
    kept fused as its checkpoints hold them)."""
    cfg = model.cfg
    offset = 1.0 if arch == "gemma3" else 0.0  # Hugging Face's Gemma stores w of its (1 + w) norms

    def norm(t: torch.Tensor) -> torch.Tensor:
        return t - offset

    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": norm(model.norm.weight)}
    if not cfg.tied_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.o_proj.weight"] = layer.attn.o_proj.weight
        sd[p + "mlp.down_proj.weight"] = layer.mlp.down_proj.weight
        sd[p + "input_layernorm.weight"] = norm(layer.input_norm.weight)
        if arch == "phi3":
            sd[p + "self_attn.qkv_proj.weight"] = layer.attn.qkv_proj.weight
            sd[p + "mlp.gate_up_proj.weight"] = layer.mlp.gate_up_proj.weight
        else:
            wq, wk, wv = layer.attn.qkv_proj.weight.split((q, kv, kv))
            gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
            sd.update(
                {
                    p + "self_attn.q_proj.weight": wq,
                    p + "self_attn.k_proj.weight": wk,
                    p + "self_attn.v_proj.weight": wv,
                    p + "mlp.gate_proj.weight": gate,
                    p + "mlp.up_proj.weight": up,
                }
            )
        if layer.attn.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = norm(layer.attn.q_norm.weight)
            sd[p + "self_attn.k_norm.weight"] = norm(layer.attn.k_norm.weight)
        if arch == "gemma3":
            sd[p + "post_attention_layernorm.weight"] = norm(layer.attn_post_norm.weight)
            sd[p + "pre_feedforward_layernorm.weight"] = norm(layer.post_norm.weight)
            sd[p + "post_feedforward_layernorm.weight"] = norm(layer.ffn_post_norm.weight)
        else:
            sd[p + "post_attention_layernorm.weight"] = layer.post_norm.weight
    return sd


def hf_config(cfg, arch: str, max_position_embeddings: int = 256) -> dict:
    """The config.json of an engine model's config (DecoderConfig)."""
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_size,
        "vocab_size": cfg.vocab_size,
        "rope_theta": cfg.rope_base,
        "rms_norm_eps": cfg.rms_eps,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": cfg.tied_embeddings,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if arch == "gemma3":
        config.update(
            query_pre_attn_scalar=cfg.head_dim,
            sliding_window=cfg.sliding_window,
            rope_local_base_freq=10000.0,
            hidden_activation="gelu_pytorch_tanh",
            layer_types=["sliding_attention" if s else "full_attention" for s in cfg.window_layers],
            final_logit_softcapping=None,
        )
    if arch == "phi3":
        config.update(partial_rotary_factor=cfg.rope_dim / cfg.head_dim, sliding_window=2047)
    return config
