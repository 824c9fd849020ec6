"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE) on the Llama family's shared layers.

The block is models/llama.py's Block with its MLP replaced by a sparse MoE layer:
    router logits (float32) -> softmax -> top-k experts per token (renormalised where the architecture does)
    -> the routed experts' SwiGLU through KernelSet.moe_experts (kernels/moe.py: a grouped matmul over tokens
       sorted by expert; one Triton launch on CUDA) -> weighted sum
    (+ Qwen2-MoE's shared expert, a dense SwiGLU scaled by sigmoid(shared_gate . x), which every token uses)
and, for Qwen3-MoE, the shared attention's QK-norm (RMSNorm over each Q and K head before RoPE).  Attention,
norms, embedding, head and the layer loop are models/layers.py's, with its module names (embed,
layers[i].attn.qkv_proj / o_proj, lm_head), so transforms written for them apply.

Parameters of a layer's MoE (`layers.{i}.mlp`):
    router.weight    (E, H) float32: the routing decision is the part most sensitive to rounding (a flipped
                     top-k choice changes the output wholesale), so it is kept and computed in float32, as
                     llama.cpp does with the F32 ffn_gate_inp of its files
    gate_up_exps     (E, 2F, H): each expert's gate rows then its up rows (one grouped matmul for both)
    down_exps        (E, H, F)
    shared.gate_up_proj / shared.down_proj, shared_gate.weight (1, H): Qwen2-MoE only
Routing statistics: `expert_counts` (E,) int64 counts the tokens routed to each expert since the last
`take_counts()` (ExpertCache's policy reads them: backends/torch_engine/expert_cache.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from backends.torch_engine.models.layers import MLP, Block, DecoderConfig, DecoderModel
from kernels.dispatch import KernelSet
from kernels.moe import route

if TYPE_CHECKING:
    from backends.torch_engine.expert_offload import ExpertOffload


@dataclass(frozen=True)
class MoEConfig(DecoderConfig):
    n_experts: int = 0  # routed experts per layer
    n_experts_used: int = 0  # top-k
    norm_topk_prob: bool = True  # renormalise the k weights to sum 1 (Mixtral, Qwen3-MoE; not Qwen2-MoE)
    shared_ffn_size: int = 0  # Qwen2-MoE's shared expert width; 0 = none


class SparseMoE(nn.Module):
    def __init__(self, cfg: MoEConfig, ops: KernelSet) -> None:
        super().__init__()
        h, f, e = cfg.hidden_size, cfg.ffn_size, cfg.n_experts
        self.top_k, self.normalize, self.ops = cfg.n_experts_used, cfg.norm_topk_prob, ops
        self.router = nn.Linear(h, e, bias=False)
        self.gate_up_exps = nn.Parameter(torch.empty(e, 2 * f, h))
        self.down_exps = nn.Parameter(torch.empty(e, h, f))
        self.shared: MLP | None = None
        self.shared_gate: nn.Linear | None = None
        if cfg.shared_ffn_size:
            self.shared = MLP(replace(cfg, ffn_size=cfg.shared_ffn_size), ops)
            self.shared_gate = nn.Linear(h, 1, bias=False)
        self.register_buffer("expert_counts", torch.zeros(e, dtype=torch.int64), persistent=False)
        # set by backends/torch_engine/expert_offload.py when this layer's experts live in host RAM
        self.offload: ExpertOffload | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (num_tokens, hidden) -> (num_tokens, hidden)."""
        logits = torch.nn.functional.linear(x.float(), self.router.weight.float())  # (num_tokens, E)
        weights, ids = route(logits, self.top_k, self.normalize)  # (num_tokens, k) each
        # index_add_, not bincount: no host synchronisation (bincount sizes its output from the data)
        self.expert_counts.index_add_(0, ids.reshape(-1), torch.ones_like(ids.reshape(-1)))
        if self.offload is not None:
            out = self.offload.run(self.ops.moe_experts, x, weights, ids)
        else:
            out = self.ops.moe_experts(x, self.gate_up_exps, self.down_exps, weights, ids)
        if self.shared is not None and self.shared_gate is not None:
            gate = torch.sigmoid(torch.nn.functional.linear(x.float(), self.shared_gate.weight.float()))
            out = out + (self.shared.forward(x).float() * gate).to(out.dtype)
        return out

    def take_counts(self) -> torch.Tensor:
        """The tokens routed to each expert since the last call, (E,) int64 on the host; resets the counts."""
        counts = self.expert_counts.to("cpu", copy=True)
        self.expert_counts.zero_()
        return counts


class MoEBlock(Block):
    """The shared pre-norm Block with a SparseMoE for its MLP."""

    def __init__(self, cfg: MoEConfig, ops: KernelSet, layer: int = 0) -> None:
        super().__init__(cfg, ops, layer)
        self.mlp = SparseMoE(cfg, ops)  # type: ignore[assignment]


class MoEModel(DecoderModel):
    """The shared decoder whose blocks are MoEBlocks: same forward, compute_logits and offload hooks."""

    block = MoEBlock

    def moe_layers(self) -> list[SparseMoE]:
        return [layer.mlp for layer in self.layers]  # type: ignore[misc]
