"""Weights of a mixture-of-experts model (GGUF or HF safetensors) into models.moe.MoEModel.

The Llama-family names (backends.weight_map) cover attention, norms, embedding and head; the MoE names here add
the router, the experts and the shared expert, as data:
- GGUF (llama.cpp) stores each layer's experts stacked: ffn_{gate,up}_exps (E, F, H) and ffn_down_exps (E, H, F)
  as (out, in) per expert; the router ffn_gate_inp (E, H); Qwen2-MoE's shared expert ffn_*_shexp and its gate
  ffn_gate_inp_shexp (H,).  (Qwen3's attn_{q,k}_norm are the shared map's.)
- HF checkpoints store one tensor per expert (Mixtral: block_sparse_moe.experts.N.w1 / w3 / w2 = gate / up / down;
  Qwen2/3-MoE: mlp.experts.N.{gate,up,down}_proj), stacked here along a new first dimension.
Gate and up fill gate_up_exps along the rows of each expert (dim 1).  Weights load dense in the compute dtype
(router and norms float32); the projection quantizations of loader.py do not apply to experts yet, so
weight_quant "gguf" (the CPU default) loads dense too and int8 / int4 / fp8 are refused, as is streaming blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch

from backends.errors import ConfigError, ModelFormatError, UnsupportedArchitectureError
from backends.modelspec import ModelSpec
from backends.torch_engine.expert_offload import default_slots, offload_experts
from backends.torch_engine.loader import base_config, complete_params
from backends.torch_engine.models.moe import MoEConfig, MoEModel
from backends.torch_engine.weights import FREQ_FACTORS, ROPE_FACTOR_TENSORS, file_weights, unreorder
from backends.weight_map import SHARDS, template
from backends.weight_map import names as weight_names
from kernels.dispatch import KernelSet
from kernels.rope import rope_inv_freq


@dataclass(frozen=True)
class MoEArch:
    gguf_qk_reordered: bool  # llama.cpp's converter permuted the Q/K rows (see loader.py)
    norm_topk_prob: bool  # llama.cpp's build_moe_ffn norm_w for this architecture
    qk_norm: bool


# "llama" with expert_count is Mixtral's GGUF architecture; HF MixtralForCausalLM maps to "llama" too
MOE_ARCHITECTURES = {
    "llama": MoEArch(True, True, False),
    "qwen2moe": MoEArch(False, False, False),
    "qwen3moe": MoEArch(False, True, True),
}

GGUF_MOE_NAMES: dict[str, tuple[str, str | None]] = {
    "blk.{i}.ffn_gate_inp.weight": ("layers.{i}.mlp.router.weight", None),
    "blk.{i}.ffn_gate_exps.weight": ("layers.{i}.mlp.gate_up_exps", "gate"),
    "blk.{i}.ffn_up_exps.weight": ("layers.{i}.mlp.gate_up_exps", "up"),
    "blk.{i}.ffn_down_exps.weight": ("layers.{i}.mlp.down_exps", None),
    "blk.{i}.ffn_gate_inp_shexp.weight": ("layers.{i}.mlp.shared_gate.weight", None),
    "blk.{i}.ffn_gate_shexp.weight": ("layers.{i}.mlp.shared.gate_up_proj.weight", "gate"),
    "blk.{i}.ffn_up_shexp.weight": ("layers.{i}.mlp.shared.gate_up_proj.weight", "up"),
    "blk.{i}.ffn_down_shexp.weight": ("layers.{i}.mlp.shared.down_proj.weight", None),
}
_L = "model.layers.{i}."
HF_MOE_NAMES: dict[str, tuple[str, str | None]] = {
    _L + "block_sparse_moe.gate.weight": ("layers.{i}.mlp.router.weight", None),
    _L + "block_sparse_moe.experts.{e}.w1.weight": ("layers.{i}.mlp.gate_up_exps", "gate"),
    _L + "block_sparse_moe.experts.{e}.w3.weight": ("layers.{i}.mlp.gate_up_exps", "up"),
    _L + "block_sparse_moe.experts.{e}.w2.weight": ("layers.{i}.mlp.down_exps", None),
    _L + "mlp.gate.weight": ("layers.{i}.mlp.router.weight", None),
    _L + "mlp.experts.{e}.gate_proj.weight": ("layers.{i}.mlp.gate_up_exps", "gate"),
    _L + "mlp.experts.{e}.up_proj.weight": ("layers.{i}.mlp.gate_up_exps", "up"),
    _L + "mlp.experts.{e}.down_proj.weight": ("layers.{i}.mlp.down_exps", None),
    _L + "mlp.shared_expert_gate.weight": ("layers.{i}.mlp.shared_gate.weight", None),
    _L + "mlp.shared_expert.gate_proj.weight": ("layers.{i}.mlp.shared.gate_up_proj.weight", "gate"),
    _L + "mlp.shared_expert.up_proj.weight": ("layers.{i}.mlp.shared.gate_up_proj.weight", "up"),
    _L + "mlp.shared_expert.down_proj.weight": ("layers.{i}.mlp.shared.down_proj.weight", None),
}
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
_FLOAT32 = ("norm.weight", "router.weight", "shared_gate.weight")  # kept in float32 (models/moe.py says why)


def expert_template(key: str) -> tuple[str, int | None]:
    """ "model.layers.{i}.mlp.experts.5.up_proj.weight" -> ("...experts.{e}.up_proj.weight", 5)."""
    m = _EXPERT.search(key)
    if m is None:
        return key, None
    return key[: m.start()] + ".experts.{e}." + key[m.end() :], int(m.group(1))


def moe_config_from_spec(spec: ModelSpec) -> MoEConfig:
    arch = MOE_ARCHITECTURES.get(spec.architecture)
    if arch is None or not spec.n_experts or not spec.n_experts_used:
        raise UnsupportedArchitectureError(
            f"the torch engine runs mixture-of-experts models of {', '.join(sorted(MOE_ARCHITECTURES))}; "
            f"{spec.name} is {spec.architecture} with {spec.n_experts} experts",
            "use --backend llama.cpp",
        )
    hf_config = spec.metadata.get("config") if spec.format != "gguf" else None
    norm = arch.norm_topk_prob
    if isinstance(hf_config, dict) and isinstance(hf_config.get("norm_topk_prob"), bool):
        norm = hf_config["norm_topk_prob"]
    base = base_config(spec)  # shapes, RoPE, biases, window, tied head; QK-norm from the tensor names
    shared = {f.name: getattr(base, f.name) for f in fields(base)}
    shared["qk_norm"] = base.qk_norm or arch.qk_norm
    return MoEConfig(
        **shared,
        n_experts=spec.n_experts,
        n_experts_used=spec.n_experts_used,
        norm_topk_prob=norm,
        shared_ffn_size=spec.shared_ffn_size,
    )


def _assemble(target: str, parts: dict[tuple[int, int], torch.Tensor], n_experts: int) -> torch.Tensor:
    """One parameter from its pieces, keyed (shard, expert): experts stacked (HF) then shards concatenated,
    along each expert's rows for *_exps, along the rows otherwise."""
    shards = sorted({s for s, _ in parts})
    pieces = []
    for s in shards:
        experts = sorted(e for sh, e in parts if sh == s)
        if target.endswith("_exps") and len(experts) > 1:
            if experts != list(range(n_experts)):
                raise ModelFormatError(
                    f"{target}: the file has {len(experts)} of {n_experts} experts", "the file is incomplete"
                )
            pieces.append(torch.stack([parts[(s, e)] for e in experts]))
        else:
            pieces.append(parts[(s, experts[0])])
    return torch.cat(pieces, dim=1 if target.endswith("_exps") else 0)


def load_moe_model(
    spec: ModelSpec,
    ops: KernelSet,
    dtype: torch.dtype,
    device: torch.device,
    weight_quant: str = "none",
    host_layers: int = 0,
    cpu_expert_layers: int = 0,
) -> MoEModel:
    """loader.load_model for a model with experts (module docstring).  cpu_expert_layers: the first so many
    layers' routed experts stay in host RAM with a device cache of the most-used (expert_offload.py); they never
    reach the device whole."""
    if weight_quant not in ("none", "gguf"):
        raise ConfigError(
            f"the torch engine loads mixture-of-experts weights dense; weight_quant {weight_quant!r} "
            "is not implemented for them",
            "use --backend llama.cpp for a quantized MoE model",
        )
    if host_layers:
        raise ConfigError(
            "the torch engine does not stream the blocks of a mixture-of-experts model from host RAM",
            "use --backend llama.cpp (its plan keeps the overflow experts in host RAM)",
        )
    cfg = moe_config_from_spec(spec)
    gguf = spec.format == "gguf"
    names = {**weight_names(spec.architecture, spec.format), **(GGUF_MOE_NAMES if gguf else HF_MOE_NAMES)}
    reorder = gguf and MOE_ARCHITECTURES[spec.architecture].gguf_qk_reordered
    with torch.device("meta"):
        model = MoEModel(cfg, ops)
    pieces: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
    freq_factors = None
    for name, tensor in file_weights(spec, dtype=dtype):
        if name in ROPE_FACTOR_TENSORS:  # Llama 3's frequency factors; the others are Phi-3's, no MoE of ours has them
            freq_factors = tensor.reshape(-1) if name == FREQ_FACTORS else freq_factors
            continue
        key, layer = template(name)
        key, expert = expert_template(key)
        if key not in names:
            continue
        target, shard = names[key]
        target = target.format(i=layer)
        if reorder and shard in ("q", "k"):
            tensor = unreorder(tensor, cfg.n_heads if shard == "q" else cfg.n_kv_heads)
        tensor = tensor.float() if target.endswith(_FLOAT32) else tensor.to(dtype)
        if target.endswith("shared_gate.weight"):
            tensor = tensor.reshape(1, cfg.hidden_size)
        pieces.setdefault(target, {})[(SHARDS[shard] if shard else 0, expert or 0)] = tensor
    params = {t: _assemble(t, p, cfg.n_experts) for t, p in pieces.items()}
    expected = complete_params(model, params, spec, f"{spec.architecture} MoE model")
    for target in expected:
        want = tuple(model.get_parameter(target).shape)
        if tuple(params[target].shape) != want:
            raise ModelFormatError(
                f"{spec.path}: {target} is {list(params[target].shape)}, but the "
                f"{spec.architecture} config needs {want}",
                "the file is damaged or its config does not match its weights",
            )
    model.load_state_dict({k: v for k, v in params.items() if k in expected}, strict=False, assign=True)
    if cfg.tied_embeddings:
        model.lm_head.weight = model.embed.weight
    for moe in model.moe_layers():
        moe.expert_counts = torch.zeros(cfg.n_experts, dtype=torch.int64)
    scaling = dict(cfg.rope_scaling)
    scaling.pop("rope_freqs_tensor", None)
    model.inv_freq = rope_inv_freq(
        cfg.head_dim, cfg.rope_base, {} if freq_factors is not None else scaling, freq_factors
    )
    if cpu_expert_layers:
        offload_experts(model, cpu_expert_layers, device, default_slots(cfg.n_experts, cfg.n_experts_used))
    return model.to(device).eval()
