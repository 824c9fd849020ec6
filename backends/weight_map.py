"""Which file tensor fills which parameter of the torch engine's decoder models (models/layers.py), and which
projections a GGUF keeps as the file's own blocks under weight_quant "gguf".  Pure data and Python (no torch):
ModelSpec.to_shape asks `repacked_params` so that the planner can price the "GGUF" torch format without importing
the engine.

It lives in backends/ rather than backends/torch_engine/ because backends' core (modelspec) needs it and must not
import the torch engine package (docs/ARCHITECTURE.md: the arrows point from the engine to the core, never back); the
engine's loader imports it from here.

The name maps: a file's tensor name (layer index as {i}) -> (model parameter, shard of a merged projection or
None); Q/K/V fill qkv_proj and gate/up fill gate_up_proj, in the order of SHARDS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

GGUF_NAMES: dict[str, tuple[str, str | None]] = {
    "token_embd.weight": ("embed.weight", None),
    "output_norm.weight": ("norm.weight", None),
    "output.weight": ("lm_head.weight", None),
    "blk.{i}.attn_norm.weight": ("layers.{i}.input_norm.weight", None),
    "blk.{i}.attn_q.weight": ("layers.{i}.attn.qkv_proj.weight", "q"),
    "blk.{i}.attn_k.weight": ("layers.{i}.attn.qkv_proj.weight", "k"),
    "blk.{i}.attn_v.weight": ("layers.{i}.attn.qkv_proj.weight", "v"),
    "blk.{i}.attn_q.bias": ("layers.{i}.attn.qkv_proj.bias", "q"),
    "blk.{i}.attn_k.bias": ("layers.{i}.attn.qkv_proj.bias", "k"),
    "blk.{i}.attn_v.bias": ("layers.{i}.attn.qkv_proj.bias", "v"),
    "blk.{i}.attn_q_norm.weight": ("layers.{i}.attn.q_norm.weight", None),  # QK-norm (Qwen3, Gemma 3)
    "blk.{i}.attn_k_norm.weight": ("layers.{i}.attn.k_norm.weight", None),
    "blk.{i}.attn_output.weight": ("layers.{i}.attn.o_proj.weight", None),
    "blk.{i}.ffn_norm.weight": ("layers.{i}.post_norm.weight", None),
    "blk.{i}.ffn_gate.weight": ("layers.{i}.mlp.gate_up_proj.weight", "gate"),
    "blk.{i}.ffn_up.weight": ("layers.{i}.mlp.gate_up_proj.weight", "up"),
    "blk.{i}.ffn_down.weight": ("layers.{i}.mlp.down_proj.weight", None),
}
HF_NAMES: dict[str, tuple[str, str | None]] = {
    "model.embed_tokens.weight": ("embed.weight", None),
    "model.norm.weight": ("norm.weight", None),
    "lm_head.weight": ("lm_head.weight", None),
    "model.layers.{i}.input_layernorm.weight": ("layers.{i}.input_norm.weight", None),
    "model.layers.{i}.self_attn.q_proj.weight": ("layers.{i}.attn.qkv_proj.weight", "q"),
    "model.layers.{i}.self_attn.k_proj.weight": ("layers.{i}.attn.qkv_proj.weight", "k"),
    "model.layers.{i}.self_attn.v_proj.weight": ("layers.{i}.attn.qkv_proj.weight", "v"),
    "model.layers.{i}.self_attn.q_proj.bias": ("layers.{i}.attn.qkv_proj.bias", "q"),
    "model.layers.{i}.self_attn.k_proj.bias": ("layers.{i}.attn.qkv_proj.bias", "k"),
    "model.layers.{i}.self_attn.v_proj.bias": ("layers.{i}.attn.qkv_proj.bias", "v"),
    "model.layers.{i}.self_attn.q_norm.weight": ("layers.{i}.attn.q_norm.weight", None),
    "model.layers.{i}.self_attn.k_norm.weight": ("layers.{i}.attn.k_norm.weight", None),
    "model.layers.{i}.self_attn.o_proj.weight": ("layers.{i}.attn.o_proj.weight", None),
    "model.layers.{i}.post_attention_layernorm.weight": ("layers.{i}.post_norm.weight", None),
    "model.layers.{i}.mlp.gate_proj.weight": ("layers.{i}.mlp.gate_up_proj.weight", "gate"),
    "model.layers.{i}.mlp.up_proj.weight": ("layers.{i}.mlp.gate_up_proj.weight", "up"),
    "model.layers.{i}.mlp.down_proj.weight": ("layers.{i}.mlp.down_proj.weight", None),
}
# Per architecture, the names that differ from the maps above (merged into them by `names`).
ARCH_GGUF_NAMES: dict[str, dict[str, tuple[str, str | None]]] = {
    # Gemma 3: a norm after attention and one after the MLP ("sandwich"); ffn_norm stays the pre-MLP norm
    "gemma3": {
        "blk.{i}.post_attention_norm.weight": ("layers.{i}.attn_post_norm.weight", None),
        "blk.{i}.post_ffw_norm.weight": ("layers.{i}.ffn_post_norm.weight", None),
    },
    # Phi-3/4: Q/K/V in one tensor, and ffn_up holds gate and up (gate first): both are our merged layout
    "phi3": {
        "blk.{i}.attn_qkv.weight": ("layers.{i}.attn.qkv_proj.weight", None),
        "blk.{i}.ffn_up.weight": ("layers.{i}.mlp.gate_up_proj.weight", None),
    },
}
ARCH_HF_NAMES: dict[str, dict[str, tuple[str, str | None]]] = {
    # Hugging Face's Gemma 3 calls the post-attention norm post_attention_layernorm (Llama's pre-MLP name)
    "gemma3": {
        "model.layers.{i}.post_attention_layernorm.weight": ("layers.{i}.attn_post_norm.weight", None),
        "model.layers.{i}.pre_feedforward_layernorm.weight": ("layers.{i}.post_norm.weight", None),
        "model.layers.{i}.post_feedforward_layernorm.weight": ("layers.{i}.ffn_post_norm.weight", None),
    },
    "phi3": {
        "model.layers.{i}.self_attn.qkv_proj.weight": ("layers.{i}.attn.qkv_proj.weight", None),
        "model.layers.{i}.mlp.gate_up_proj.weight": ("layers.{i}.mlp.gate_up_proj.weight", None),
    },
}


def names(architecture: str, file_format: str) -> dict[str, tuple[str, str | None]]:
    """The whole name map of one architecture and file format ("gguf" or "safetensors")."""
    if file_format == "gguf":
        return {**GGUF_NAMES, **ARCH_GGUF_NAMES.get(architecture, {})}
    return {**HF_NAMES, **ARCH_HF_NAMES.get(architecture, {})}


SHARDS = {"q": 0, "k": 1, "v": 2, "gate": 0, "up": 1}  # order of shards inside a merged parameter

# GGUF block types whose projections weight_quant "gguf" keeps, and the layout kernels/quant_matmul.py gets
# from gguf_repack.repack_gguf (group size 32 for all; the K-quants' 256-value blocks are 8 groups of 32).
REPACK_KIND = {
    **dict.fromkeys(("Q4_0", "Q4_1", "Q4_K"), "int4"),
    **dict.fromkeys(("Q8_0", "Q5_0", "Q6_K", "Q5_1", "Q5_K", "Q3_K", "Q2_K"), "int8"),
    **dict.fromkeys(("IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S"), "int8"),
}

# On a GPU the loader keeps Q6_K blocks as they are (kind "q6", 6.5625 bits: backends/torch_engine/loader.native_q6),
# the rest as REPACK_KIND; hwprobe.memory prices a GPU load with these.
GPU_REPACK_KIND = {**REPACK_KIND, "Q6_K": "q6"}

_LAYER = re.compile(r"\.(\d+)\.")


class _Tensor(Protocol):  # backends.modelspec.TensorSpec (not imported: modelspec imports this module)
    name: str
    ggml_type: str
    n_elements: int


def template(name: str) -> tuple[str, int | None]:
    """ "blk.3.attn_q.weight" -> ("blk.{i}.attn_q.weight", 3); names outside the blocks -> (name, None)."""
    m = _LAYER.search(name)
    if m is None:
        return name, None
    return name[: m.start()] + ".{i}." + name[m.end() :], int(m.group(1))


def is_projection_param(target: str) -> bool:
    """Model parameter names of the nn.Linear projections inside the blocks (quantize_model's targets but the
    head)."""
    return target.startswith("layers.") and target.endswith("proj.weight")


FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def unkept_types(tensors: Iterable[_Tensor], n_layers: int, architecture: str = "llama") -> tuple[str, ...]:
    """The quantized GGUF types of the blocks' projections that have no layout of the engine's own (no
    REPACK_KIND: IQ1_S, TQ1_0, MXFP4 ...), which a load dequantizes to 16 bits; sorted, () when none."""
    name_map = names(architecture, "gguf")
    found = set()
    for t in tensors:
        key, layer = template(t.name)
        target = name_map.get(key, ("", None))[0]
        if layer is not None and layer < n_layers and is_projection_param(target):
            if t.ggml_type not in REPACK_KIND and t.ggml_type not in FLOAT_TYPES:
                found.add(t.ggml_type)
    return tuple(sorted(found))


def repacked_params(
    tensors: Iterable[_Tensor], n_layers: int, architecture: str = "llama"
) -> tuple[tuple[int, int], ...]:
    """Per layer, (weights kept as int4, weights kept as int8) when a GGUF loads with weight_quant "gguf": a
    projection keeps its blocks when every shard of its merged parameter has a REPACK_KIND, each shard at its own
    kind (one QuantLinear when they share it, else a SplitLinear of the parts: the loader's _merge rule,
    gguf_repack.merge_kept); the others are dequantized to the compute dtype.  The head and the embedding are
    outside the blocks: ModelSpec.to_shape gives their kinds (extra["gguf_head_kind"], ["gguf_embed_kind"])."""
    kept = [[0, 0] for _ in range(n_layers)]
    for layer, t in _kept_projections(tensors, n_layers, architecture):
        kept[layer][0 if REPACK_KIND[t.ggml_type] == "int4" else 1] += t.n_elements
    return tuple((a, b) for a, b in kept)


def q6_params(tensors: Iterable[_Tensor], n_layers: int, architecture: str = "llama") -> tuple[int, ...]:
    """Per layer, the weights of repacked_params' int8 ones that are Q6_K: on a GPU they stay q6 (GPU_REPACK_KIND)."""
    kept = [0] * n_layers
    for layer, t in _kept_projections(tensors, n_layers, architecture):
        kept[layer] += t.n_elements if t.ggml_type == "Q6_K" else 0
    return tuple(kept)


def _kept_projections(tensors: Iterable[_Tensor], n_layers: int, architecture: str) -> Iterator[tuple[int, _Tensor]]:
    """(layer, tensor) of every block projection shard a "gguf" load keeps as blocks (repacked_params' rule)."""
    groups: dict[tuple[int, str], list[_Tensor]] = {}
    name_map = names(architecture, "gguf")
    for t in tensors:
        key, layer = template(t.name)
        target = name_map.get(key, ("", None))[0]
        if layer is not None and layer < n_layers and is_projection_param(target):
            groups.setdefault((layer, target), []).append(t)
    for (layer, _), parts in groups.items():
        if all(t.ggml_type in REPACK_KIND for t in parts):
            yield from ((layer, t) for t in parts)
