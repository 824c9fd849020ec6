"""weight_map.repacked_params: which GGUF projections the torch engine keeps as blocks, each shard of a merged one at
its own kind (the loader's _merge rule),
as ModelSpec.to_shape hands it to the planner; pure Python (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from backends.weight_map import repacked_params, template


@dataclass(frozen=True)
class T:  # the three TensorSpec fields repacked_params reads
    name: str
    ggml_type: str
    n_elements: int


def _layer(
    i: int,
    q: str = "Q4_K",
    k: str = "Q4_K",
    v: str = "Q4_K",
    o: str = "Q4_K",
    gate: str = "Q4_K",
    up: str = "Q4_K",
    down: str = "Q4_K",
) -> list[T]:
    b = f"blk.{i}."
    return [
        T(b + "attn_q.weight", q, 100),
        T(b + "attn_k.weight", k, 20),
        T(b + "attn_v.weight", v, 20),
        T(b + "attn_output.weight", o, 100),
        T(b + "ffn_gate.weight", gate, 300),
        T(b + "ffn_up.weight", up, 300),
        T(b + "ffn_down.weight", down, 300),
        T(b + "attn_norm.weight", "F32", 10),
        T(b + "attn_q.bias", "F32", 10),
    ]


def test_template() -> None:
    assert template("blk.12.ffn_up.weight") == ("blk.{i}.ffn_up.weight", 12)
    assert template("output.weight") == ("output.weight", None)


def test_merged_parameters_keep_their_blocks_only_when_every_shard_repacks() -> None:
    tensors = [
        *_layer(0),  # all Q4_K: 1140 int4
        *_layer(1, v="Q6_K", down="Q6_K"),  # Q4_K_M's "more bits" layer: Q and K int4 beside V int8 (split), down int8
        *_layer(2, q="Q4_0", k="Q4_1", v="Q4_K", gate="Q8_0", up="Q8_0", down="Q8_0"),  # int4 mixes; gate/up int8
        *_layer(3, v="Q8_0", gate="F16"),  # F16 never repacks: gate/up dense; Q/K int4 beside V int8
        *_layer(4),  # beyond n_layers (a stray tensor): ignored
        T("token_embd.weight", "Q4_K", 5000),
        T("output.weight", "Q6_K", 5000),  # not projections
    ]
    assert repacked_params(tensors, 4) == ((1140, 0), (120 + 100 + 600, 20 + 300), (240, 900), (120 + 100 + 300, 20))


def test_a_file_without_repackable_types_keeps_nothing() -> None:
    assert repacked_params(_layer(0, *["IQ1_S"] * 7) + _layer(1, *["F16"] * 7), 2) == ((0, 0), (0, 0))


def test_q5_0_and_q6_k_keep_their_blocks_as_int8() -> None:
    # Gemma 3 270M's Q4_K_M: Q/K/V and gate/up Q5_0 (attn_v Q8_0 in half the layers), down Q4_K or Q6_K
    tensors = _layer(0, "Q5_0", "Q5_0", "Q8_0", "Q4_K", "Q5_0", "Q5_0", "Q6_K")
    assert repacked_params(tensors, 1) == ((100, 140 + 600 + 300),)


def test_architecture_name_maps() -> None:
    from backends.weight_map import names

    phi = names("phi3", "gguf")
    assert phi["blk.{i}.attn_qkv.weight"] == ("layers.{i}.attn.qkv_proj.weight", None)  # fused: no shard
    assert phi["blk.{i}.ffn_up.weight"] == ("layers.{i}.mlp.gate_up_proj.weight", None)  # gate and up together
    assert names("llama", "gguf")["blk.{i}.ffn_up.weight"] == ("layers.{i}.mlp.gate_up_proj.weight", "up")
    gemma_hf = names("gemma3", "safetensors")
    # Hugging Face's Gemma names its post-attention norm like Llama's pre-MLP one
    assert gemma_hf["model.layers.{i}.post_attention_layernorm.weight"][0] == "layers.{i}.attn_post_norm.weight"
    assert gemma_hf["model.layers.{i}.pre_feedforward_layernorm.weight"][0] == "layers.{i}.post_norm.weight"
    assert (
        names("qwen3", "safetensors")["model.layers.{i}.self_attn.q_norm.weight"][0] == "layers.{i}.attn.q_norm.weight"
    )


def test_phi3_fused_projections_keep_their_blocks() -> None:
    tensors = [
        T("blk.0.attn_qkv.weight", "Q4_K", 300),
        T("blk.0.attn_output.weight", "Q4_K", 100),
        T("blk.0.ffn_up.weight", "Q8_0", 600),
        T("blk.0.ffn_down.weight", "IQ1_M", 300),
    ]
    assert repacked_params(tensors, 1, "phi3") == ((400, 600),)
    assert repacked_params(tensors, 1) == ((100, 600),)  # read as Llama names, attn_qkv is no projection
