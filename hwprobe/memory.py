"""All of hearth's memory arithmetic: weights, KV cache, compute buffers, runtime overhead and margins, in bytes.

Nothing else in hearth multiplies bytes; the planner asks this module.  The formulas follow what llama.cpp
allocates, checked against its own log on this machine (tests/hwprobe/test_estimator_vs_llama_cpp.py):

- weights: the GGUF's own tensor bytes when a file exists (exact), else parameters x the quant's bits per weight
  (llama.cpp's tools/quantize README, Llama-3.1-8B; Q3_K_M from `llama-quantize --help`, 3.74 GiB on 8.03 B
  parameters).  The token embedding stays in host RAM with llama.cpp (its input layer is always on the CPU);
  the output head goes to the GPU with the last layer (a tied head is duplicated there).
- KV cache: 2 (K and V) x kv_heads x head_dim x bytes per element x cells, per layer; cells = context, except that
  sliding-window layers need only window + n_ubatch (padded to 256) when the cache is not "full size".
  llama-cpp-python's default is the full-size SWA cache (its log: "using full-size SWA cache"), so plans for
  llama.cpp count every layer at the full context.
- compute buffer: the larger of the logits peak, 4 x n_ubatch x (vocab + 2 x hidden) bytes, and the attention
  peak, 4 x n_ubatch x (ctx x (heads + 1) + 2 x ffn + kv_dim) without flash attention (the KQ scores and mask in
  f32) or 4 x n_ubatch x (2 x ffn + hidden) + 2 x n_ubatch x ctx with it.
- the torch engine streaming its first blocks from host RAM: those blocks' bytes in (pinned) host RAM, and on
  the GPU two buffers of the largest of them (offload_buffer_bytes) besides the resident blocks and every
  layer's KV cache.
- overhead per GPU: the CUDA context, cuBLAS workspace and llama.cpp's own small buffers; more for PyTorch
  (its caching allocator keeps freed blocks).
- safety margin: what the planner never plans into: max(512 MiB, 3 % of the card) per GPU, 1 GiB of host RAM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hwprobe.shape import ModelShape

MIB = 1024 * 1024

# The GGUF quant ladder, best first, with llama.cpp's bits per weight.
QUANT_LADDER = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
QUANT_BPW = {"F32": 32.0, "BF16": 16.0, "F16": 16.0, "Q8_0": 8.50, "Q6_K": 6.56, "Q5_K_M": 5.70, "Q5_K_S": 5.57,
             "Q5_0": 5.5, "Q5_1": 6.0, "Q4_K_M": 4.89, "Q4_K_S": 4.67, "Q4_0": 4.5, "Q4_1": 5.0,
             "Q3_K_M": 4.00, "Q3_K_L": 4.30, "Q3_K_S": 3.64, "Q2_K": 3.16}
LOWEST_DEFAULT_QUANT = "Q4_K_M"  # below this only when the user asks (quality drops fast)

# The torch engine's weight formats: bits per weight of the linear layers (embeddings and head stay 16-bit).
# W8A16: int8 + one fp16 scale per output channel; W4A16: int4 in groups of 128 with fp16 scale and zero;
# FP8: e4m3 + a per-channel scale, native on compute capability 8.9+.
TORCH_FORMAT_BPW = {"fp32": 32.0, "bf16": 16.0, "fp16": 16.0, "FP8": 8.0, "W8A16": 8.0, "W4A16": 4.25}
# "GGUF": the torch engine keeps a GGUF's own Q4_0/Q4_1/Q4_K/Q8_0 projection blocks (weight_quant "gguf"),
# repacked into groups of 32 with scales (and int4 offsets) in the 16-bit compute dtype: int4 0.5 + 2 x 2/32
# bytes per weight (5.0 bits: Q4_0's 4.5 gains an offset, Q4_K's 4.5 loses its 6-bit sub-block packing), int8
# 1 + 2/32 (8.5 bits, Q8_0's own size).  Projections that do not repack, embedding and head are 16-bit; RMSNorm
# weights float32.  Which projections repack comes from the file (shape.extra["gguf_repacked"]).
TORCH_GGUF = "GGUF"
GGUF_REPACKED_INT4_BYTES = 0.5 + 2 * 2 / 32
GGUF_REPACKED_INT8_BYTES = 1 + 2 / 32

KV_BYTES_PER_ELEMENT = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}  # block of 32 + fp16 scale

LLAMA_CPP_SWA_FULL = True  # llama-cpp-python's default (see the module docstring)
LLAMA_CPP_GPU_OVERHEAD_BYTES = 450 * MIB  # CUDA context + cuBLAS; Ollama counts ~457 MiB
TORCH_GPU_OVERHEAD_BYTES = 900 * MIB  # CUDA context + cuBLAS + caching-allocator slack
GPU_MARGIN_MIN_BYTES = 512 * MIB
GPU_MARGIN_FRACTION = 0.03
RAM_MARGIN_BYTES = 1024 * MIB


def mib(n_bytes: float) -> int:
    """Bytes -> MiB, rounded up (plans must never look smaller than they are)."""
    return int(math.ceil(n_bytes / MIB))


def gpu_budget_bytes(free_mib: int, total_mib: int) -> int:
    """What a plan may use on a GPU: its free memory minus the safety margin."""
    margin = max(GPU_MARGIN_MIN_BYTES, GPU_MARGIN_FRACTION * total_mib * MIB)
    return max(0, int(free_mib * MIB - margin))


def ram_budget_bytes(available_mib: int) -> int:
    return max(0, available_mib * MIB - RAM_MARGIN_BYTES)


@dataclass(frozen=True)
class WeightLayout:
    layer_bytes: tuple[int, ...]  # each transformer block
    embedding_bytes: int  # token embedding table
    head_bytes: int  # output head (a tied head costs the embedding's bytes again wherever it is duplicated)
    other_bytes: int  # output norm and anything outside the blocks
    tied: bool = False  # the head is the embedding (stored once in the file)

    @property
    def total_bytes(self) -> int:
        """Bytes of the file (a tied head is not stored twice)."""
        return sum(self.layer_bytes) + self.embedding_bytes + self.other_bytes + (0 if self.tied else self.head_bytes)


def _params_per_layer(shape: ModelShape) -> int:
    q = shape.hidden_size * shape.n_heads * shape.head_dim
    kv = 2 * shape.hidden_size * shape.n_kv_heads * shape.head_dim
    o = shape.n_heads * shape.head_dim * shape.hidden_size
    ffn = 3 * shape.hidden_size * shape.ffn_size * max(shape.n_experts, 1)
    return q + kv + o + ffn + shape.hidden_size * shape.n_experts + 2 * shape.hidden_size


def weights(shape: ModelShape, quant: str | None = None) -> WeightLayout:
    """Weight bytes by place.  quant=None: the file's exact bytes (needs shape.layer_bytes); a quant name: the
    GGUF ladder's bits per weight; a torch format (TORCH_FORMAT_BPW): linear layers at it, embeddings at 16;
    TORCH_GGUF: the torch engine holding the file's own blocks (torch_gguf_weights)."""
    if quant is None:
        if not shape.layer_bytes or shape.weight_bytes is None:
            raise ValueError(f"{shape.name}: no file bytes; give a quant")
        embed = shape.embedding_bytes or 0
        head = embed if shape.tied_embeddings or not shape.output_bytes else shape.output_bytes
        stored_head = 0 if shape.tied_embeddings or not shape.output_bytes else head
        other = shape.weight_bytes - sum(shape.layer_bytes) - embed - stored_head
        return WeightLayout(tuple(shape.layer_bytes), embed, head, max(other, 0), stored_head == 0)
    if quant == TORCH_GGUF:
        layout = torch_gguf_weights(shape)
        if layout is None:
            raise ValueError(f"{shape.name}: no GGUF projections the torch engine keeps as blocks")
        return layout
    embed_params = shape.vocab_size * shape.hidden_size
    per_layer = _params_per_layer(shape)
    if quant in TORCH_FORMAT_BPW:
        layer_bpw, embed_bpw = TORCH_FORMAT_BPW[quant], 16.0
    else:
        layer_bpw = embed_bpw = QUANT_BPW[quant]
    layer = int(per_layer * layer_bpw / 8)
    embed = int(embed_params * embed_bpw / 8)
    return WeightLayout((layer,) * shape.n_layers, embed, embed, shape.hidden_size * 4, shape.tied_embeddings)


def torch_gguf_weights(shape: ModelShape) -> WeightLayout | None:
    """What the torch engine holds on a GPU for a GGUF loaded with its own blocks (TORCH_GGUF), or None when no
    projection of the file repacks (an F16 or Q6_K file: that would just be bf16)."""
    kept = shape.extra.get("gguf_repacked") if shape.extra else None
    if not kept or not any(n4 or n8 for n4, n8 in kept) or len(kept) != shape.n_layers:
        return None
    norms = 2 * shape.hidden_size
    projections = _params_per_layer(shape) - norms
    layers = tuple(int(n4 * GGUF_REPACKED_INT4_BYTES + n8 * GGUF_REPACKED_INT8_BYTES
                       + (projections - n4 - n8) * 2 + norms * 4) for n4, n8 in kept)
    embed = shape.vocab_size * shape.hidden_size * 2
    return WeightLayout(layers, embed, embed, shape.hidden_size * 4, shape.tied_embeddings)


def gguf_repacked_shares(shape: ModelShape) -> tuple[float, float]:
    """Shares of the projection weights a TORCH_GGUF load keeps as int4 and as int8 blocks (for the reasons)."""
    kept = shape.extra.get("gguf_repacked") if shape.extra else None
    if not kept:
        return 0.0, 0.0
    projections = max((_params_per_layer(shape) - 2 * shape.hidden_size) * shape.n_layers, 1)
    return sum(n4 for n4, _ in kept) / projections, sum(n8 for _, n8 in kept) / projections


def kv_cells(shape: ModelShape, ctx: int, *, sliding: bool, swa_full: bool, n_ubatch: int = 512) -> int:
    """KV cells one layer keeps: the context, or for a sliding-window layer with a windowed cache the window."""
    if sliding and not swa_full and shape.sliding_window:
        return min(ctx, int(math.ceil((shape.sliding_window + n_ubatch) / 256) * 256))
    return ctx


def kv_bytes(shape: ModelShape, ctx: int, kv_type: str = "f16", *, swa_full: bool = LLAMA_CPP_SWA_FULL,
             n_ubatch: int = 512) -> int:
    """KV cache of all layers for one sequence of `ctx` tokens."""
    per_cell = 2 * shape.n_kv_heads * shape.head_dim * KV_BYTES_PER_ELEMENT[kv_type]
    n_swa = shape.sliding_window_layers if shape.sliding_window else 0
    swa = kv_cells(shape, ctx, sliding=True, swa_full=swa_full, n_ubatch=n_ubatch)
    return int(per_cell * ((shape.n_layers - n_swa) * ctx + n_swa * swa))


def compute_bytes(shape: ModelShape, ctx: int, *, n_ubatch: int = 512, flash_attn: bool = False,
                  with_logits: bool = True) -> int:
    """llama.cpp's compute buffer for a batch of n_ubatch tokens (see the module docstring for the fit)."""
    n = min(n_ubatch, ctx)
    ffn = shape.ffn_size * max(shape.n_experts_used, 1)
    kv_dim = shape.n_kv_heads * shape.head_dim
    if flash_attn:
        attn = 4 * n * (2 * ffn + shape.hidden_size) + 2 * n * ctx
    else:
        attn = 4 * n * (ctx * (shape.n_heads + 1) + 2 * ffn + kv_dim)
    logits = 4 * n * (shape.vocab_size + 2 * shape.hidden_size) if with_logits else 4 * n * 2 * shape.hidden_size
    return max(attn, logits)


def offload_buffer_bytes(streamed_layer_bytes: tuple[int, ...], num_buffers: int) -> int:
    """The torch engine's device buffers for blocks streamed from host RAM (backends/torch_engine/offload.py):
    min(num_buffers, blocks streamed) of them, each the size of the largest streamed block (any block may land
    in any buffer).  Two buffers of a bf16 Llama-2-7B block: 2 x 405 MB = 0.75 GiB."""
    if not streamed_layer_bytes:
        return 0
    return min(num_buffers, len(streamed_layer_bytes)) * max(streamed_layer_bytes)


def output_buffer_bytes(shape: ModelShape) -> int:
    """llama.cpp's host-side output buffer: one row of float logits per sequence."""
    return 4 * shape.vocab_size


def decode_bytes_per_token(layout: WeightLayout, shape: ModelShape) -> float:
    """Weight bytes read per generated token: all of a dense model; for MoE only the experts used."""
    layers = sum(layout.layer_bytes)
    if shape.n_experts and shape.n_experts_used:
        ffn_share = 3 * shape.hidden_size * shape.ffn_size * shape.n_experts / _params_per_layer(shape)
        layers *= 1 - ffn_share * (1 - shape.n_experts_used / shape.n_experts)
    return layers + layout.head_bytes
