"""The layers every dense decoder family shares, and the decoder model built from them.

    embedding (x embed_scale) -> N x Block -> final RMSNorm -> lm head (-> tanh softcap)

A family (llama.py, qwen3.py, gemma3.py, phi3.py) says which Block its layers are and fills a DecoderConfig;
everything else (attention over the paged KV cache, RMSNorm, the gated MLP, RoPE tables, the layer loop with
its offload hooks) lives here once.  Module and projection names are fixed, because other transforms find
them by name (quantize.py, offload.py, tensor parallelism): embed, layers[i].attn.qkv_proj / o_proj,
layers[i].mlp.gate_up_proj / down_proj, lm_head; head counts come from the config.

Weight layout follows Hugging Face: Q/K rows in rotate-half ("NEOX") order (the loader undoes llama.cpp's
reorder for GGUF files where its converter made one), Q/K/V merged into one `qkv_proj` and gate/up into one
`gate_up_proj` so a step makes two matmuls fewer per layer.  The model holds no KV cache and no per-step
state: the runner passes the caches and the step's AttentionMetadata to `forward`.  Which op implementations
run is the KernelSet given here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kernels.attention import AttentionMetadata, with_sliding_window
from kernels.dispatch import KernelSet
from kernels.rope import rope_cos_sin

if TYPE_CHECKING:
    from backends.torch_engine.offload import LayerStreamer
    from backends.torch_engine.scripted_decode import ScriptedDecode


@dataclass(frozen=True)
class DecoderConfig:
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
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm over each head of Q and of K, before RoPE
    sliding_window: int = 0  # tokens a sliding-window layer's query sees (itself included); 0 = none
    window_layers: tuple[bool, ...] = ()  # per layer: True = sliding window; () = every layer when sliding_window
    rope_base_local: float = 0.0  # Gemma 3: RoPE base of the sliding-window layers (0 = rope_base, same tables)
    rope_dim: int = 0  # dimensions of each head that RoPE rotates (0 = head_dim); Phi-4-mini rotates 3/4
    rope_factors: tuple[float, ...] = ()  # per rotated pair, frequency divisors (Phi-3 LongRoPE's short factors)
    rope_factors_long: tuple[float, ...] = ()  # LongRoPE's long factors, used when the context passes the original
    rope_original_ctx: int = 0  # LongRoPE: the original training context (0 = no long/short choice)
    rope_attn_factor: float = 1.0  # cos and sin are multiplied by it (LongRoPE's attention factor)
    attn_scale: float = 0.0  # query scale (0 = head_dim ** -0.5); Gemma 3 names its own
    activation: str = "silu"  # the gated MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0  # Gemma: the embedding is multiplied by sqrt(hidden_size)
    final_softcap: float = 0.0  # logits = c * tanh(logits / c) when c > 0 (Gemma 2 style); 0 = none

    def is_sliding(self, layer: int) -> bool:
        if not self.sliding_window:
            return False
        return self.window_layers[layer] if self.window_layers else True


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
    """GQA attention over the paged KV cache.  Options from the config: Q/K/V biases, per-head QK-norm,
    a sliding window (this layer's), partial rotary dimensions, the query scale."""

    def __init__(self, cfg: DecoderConfig, ops: KernelSet, layer: int = 0) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps, ops)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps, ops)
        self.qk_norm = cfg.qk_norm
        self.scale = cfg.attn_scale or cfg.head_dim**-0.5
        self.window = cfg.sliding_window if cfg.is_sliding(layer) else 0
        self.rope_dim = cfg.rope_dim if 0 < cfg.rope_dim < cfg.head_dim else 0
        self.ops = ops

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.reshape(n, self.n_heads, self.head_dim)  # (num_tokens, num_heads, head_dim)
        k = k.reshape(n, self.n_kv_heads, self.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        v = v.view(n, self.n_kv_heads, self.head_dim)
        if self.qk_norm:  # over each head's vector: rows of (num_tokens * heads, head_dim)
            q = self.q_norm.forward(q.reshape(-1, self.head_dim)).view(n, self.n_heads, self.head_dim)
            k = self.k_norm.forward(k.reshape(-1, self.head_dim)).view(n, self.n_kv_heads, self.head_dim)
        if self.rope_dim:  # partial rotary: only the first rope_dim dimensions of each head turn
            r = self.rope_dim
            q_rot, k_rot = self.ops.rope(q[..., :r].contiguous(), k[..., :r].contiguous(), cos, sin)
            q, k = torch.cat([q_rot, q[..., r:]], dim=-1), torch.cat([k_rot, k[..., r:]], dim=-1)
        else:
            q, k = self.ops.rope(q, k, cos, sin)
        self.ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, meta.memo)
        if self.window:
            meta = with_sliding_window(meta, self.window)
        out = self.ops.paged_attention(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(n, -1))


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), gate and up merged into one projection."""

    def __init__(self, cfg: DecoderConfig, ops: KernelSet) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)
        if cfg.activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"unknown MLP activation {cfg.activation!r}")
        self.act = ops.silu_and_mul if cfg.activation == "silu" else ops.gelu_tanh_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class Block(nn.Module):
    """Pre-norm block (Llama, Qwen, Mistral, Phi-3): x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: DecoderConfig, ops: KernelSet, layer: int = 0) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.attn = Attention(cfg, ops, layer)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.mlp = MLP(cfg, ops)
        self.local_rope = bool(cfg.rope_base_local) and cfg.is_sliding(layer)  # which RoPE tables it reads

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
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


class DecoderModel(nn.Module):
    """forward(input_ids, positions, kv_caches, meta) -> final hidden states; compute_logits(hidden) -> logits.

    input_ids, positions: (num_tokens,) int64, the step's tokens of all sequences flattened in batch order.
    kv_caches: per layer (k_cache, v_cache), each (num_blocks, block_size, n_kv_heads, head_dim).
    A family sets `block` to its Block class (same forward contract as Block.forward).
    """

    block: type[nn.Module] = Block

    def __init__(self, cfg: DecoderConfig, ops: KernelSet) -> None:
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
        self.layers = nn.ModuleList(self.block(cfg, ops, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, ops)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        rot = cfg.rope_dim if 0 < cfg.rope_dim < cfg.head_dim else cfg.head_dim
        # (rotated dims // 2,) float32; the loader overwrites both with the file's frequencies and scaling
        self.register_buffer("inv_freq", torch.ones(rot // 2), persistent=False)
        self.register_buffer("inv_freq_local", torch.ones(rot // 2) if cfg.rope_base_local else None, persistent=False)
        # set by backends.torch_engine.offload.offload_layers when some blocks' weights live in host memory
        self.offload: LayerStreamer | None = None
        # set by the runner when the layer loop of CPU decode steps can run as one TorchScript call
        # (backends/torch_engine/scripted_decode.py): same ops, same bits, without the Python between them
        self.scripted_decode: ScriptedDecode | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (num_tokens, 1, rotated dims // 2) each
        if self.cfg.rope_attn_factor != 1.0:  # LongRoPE scales q.k through both rotated vectors (llama.cpp: mscale)
            cos, sin = cos * self.cfg.rope_attn_factor, sin * self.cfg.rope_attn_factor
        local = (cos, sin) if self.inv_freq_local is None else rope_cos_sin(positions, self.inv_freq_local)
        x = self.embed(input_ids)  # (num_tokens, hidden)
        if self.cfg.embed_scale != 1.0:  # rounded to the compute dtype first, as Hugging Face's Gemma does
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        scripted = self.scripted_decode
        if scripted is not None and self.offload is None and scripted.accepts(meta, x.shape[0]):
            x, residual = scripted.layers(
                x, cos, sin, local, meta, lambda: self._layers(x, cos, sin, local, kv_caches, meta)
            )
        else:
            x, residual = self._layers(x, cos, sin, local, kv_caches, meta)
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm.add_forward(x, residual)[0]

    def _layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        local: tuple[torch.Tensor, torch.Tensor],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer loop: (last block's MLP output, the residual stream before it; None without layers)."""
        residual: torch.Tensor | None = None
        streamer = self.offload
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            if streamer is not None:  # its weights may still be crossing the bus: wait for them, prefetch the next
                streamer.before_layer(i)
            c, s = local if getattr(layer, "local_rope", False) else (cos, sin)  # a family's block may lack it
            x, residual = layer.forward(x, residual, c, s, k_cache, v_cache, meta)
            if streamer is not None:
                streamer.after_layer(i)
        return x, residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> (n, vocab) float32."""
        head = self.lm_head
        if hidden.shape[0] == 1 and type(head) is nn.Linear and head.bias is None and not hidden.is_cuda:
            # one row on CPU (a single stream's decode step): a matrix-vector product.  torch's bf16 linear
            # takes a GEMM path for it that read the starter's 49152 x 576 head in 2.2 ms at 2 threads and
            # 4.7 ms at 1 on the 2-core Xeon; mv 1.5 and 2.6 ms.  Same products, float32 accumulation in both;
            # the row rounds within the one bf16 rounding a row's logits may move between batch sizes.
            logits = torch.mv(head.weight, hidden[0])[None].float()
        else:
            logits = head(hidden).float()
        cap = self.cfg.final_softcap
        return logits if not cap else torch.tanh(logits / cap) * cap
