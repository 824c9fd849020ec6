"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, SmolLM2) as a plain nn.Module.

embedding -> N x [RMSNorm -> GQA attention over the paged KV cache -> residual,
                  RMSNorm -> SwiGLU MLP -> residual] -> final RMSNorm -> lm head.

Weight layout follows Hugging Face: Q/K rows in rotate-half ("NEOX") order (the loader undoes llama.cpp's
reorder for GGUF files), Q/K/V merged into one `qkv_proj` and gate/up into one `gate_up_proj` so a step makes
two matmuls fewer per layer.  The model holds no KV cache and no per-step state: the runner passes the caches
and the step's AttentionMetadata to `forward`.  Which op implementations run is the KernelSet given here.
Each residual add is fused with the RMSNorm after it (KernelSet.add_rms_norm: one Triton kernel on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kernels.attention import AttentionMetadata
from kernels.dispatch import KernelSet
from kernels.rope import rope_cos_sin

if TYPE_CHECKING:
    from backends.torch_engine.offload import LayerStreamer


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    rms_eps: float
    rope_base: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # see kernels.rope.rope_inv_freq
    qkv_bias: bool = False  # Qwen2 has biases on Q, K and V
    tied_embeddings: bool = False  # lm head shares the token embedding's weight


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: KernelSet) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): one fused kernel on the Triton path (one pass over the row)."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, ops: KernelSet) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim ** -0.5
        self.ops = ops

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(n, self.n_heads, self.head_dim)  # (num_tokens, num_heads, head_dim)
        k = k.view(n, self.n_kv_heads, self.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        v = v.view(n, self.n_kv_heads, self.head_dim)
        q, k = self.ops.rope(q, k, cos, sin)
        self.ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, meta.memo)
        out = self.ops.paged_attention(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, ops: KernelSet) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, ops: KernelSet) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.attn = Attention(cfg, ops)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.mlp = MLP(cfg, ops)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous block's MLP output (the embedding for block 0, with residual None); residual: the
        stream before it.  Returns (this block's MLP output, the stream before it): each residual add is fused
        with the RMSNorm that follows it (ops.add_rms_norm), the last one with the model's final norm."""
        # .forward, not __call__: no hooks are used here, and nn.Module's call machinery is ~10 % of a
        # batch-1 CPU decode step at 30 layers x 6 calls
        if residual is None:
            h, residual = self.input_norm.forward(x), x
        else:
            h, residual = self.input_norm.add_forward(x, residual)
        h, residual = self.post_norm.add_forward(self.attn.forward(h, cos, sin, k_cache, v_cache, meta), residual)
        return self.mlp.forward(h), residual


class LlamaModel(nn.Module):
    """forward(input_ids, positions, kv_caches, meta) -> final hidden states; compute_logits(hidden) -> logits.

    input_ids, positions: (num_tokens,) int64, the step's tokens of all sequences flattened in batch order.
    kv_caches: per layer (k_cache, v_cache), each (num_blocks, block_size, n_kv_heads, head_dim).
    """

    def __init__(self, cfg: LlamaConfig, ops: KernelSet) -> None:
        super().__init__()
        self.cfg = cfg
        self.ops = ops
        # nn.Embedding's own init (normal_) on the meta device, where the loader builds the model, runs through
        # torch._refs and imports torch._dynamo and triton: ~150 MiB of resident memory for values the loader
        # overwrites.  So the table is made here and initialised only on a real device.
        table = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if table.device.type != "meta":
            nn.init.normal_(table)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=table)
        self.layers = nn.ModuleList(Block(cfg, ops) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        # (head_dim // 2,) float32; the loader overwrites it when the file carries frequency factors
        self.register_buffer("inv_freq", torch.ones(cfg.head_dim // 2), persistent=False)
        # set by backends.torch_engine.offload.offload_layers when some blocks' weights live in host memory
        self.offload: LayerStreamer | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (num_tokens, 1, head_dim // 2) each
        x = self.embed(input_ids)  # (num_tokens, hidden)
        residual: torch.Tensor | None = None
        streamer = self.offload
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            if streamer is not None:  # its weights may still be crossing the bus: wait for them, prefetch the next
                streamer.before_layer(i)
            x, residual = layer.forward(x, residual, cos, sin, k_cache, v_cache, meta)
            if streamer is not None:
                streamer.after_layer(i)
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm.add_forward(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> (n, vocab) float32."""
        return self.lm_head(hidden).float()
