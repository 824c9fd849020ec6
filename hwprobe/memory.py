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
- the torch engine's KV pool (torch_kv_pool_bytes): paged, in blocks of TORCH_KV_BLOCK_TOKENS tokens, sized
  by the plan to what is left of the device's budget after weights, compute buffers and overhead, capped at
  max_num_seqs full-context sequences and never below one (then the candidate does not fit); the engine
  allocates exactly that (LoadOptions.kv_cache_bytes).
- the torch engine on the CPU (torch_cpu_weights): what it holds after loading, measured on the starter: a
  GGUF's Q4_0/Q4_1/Q4_K projections repacked for torch's int4 CPU kernel (0.625 bytes a weight), Q8_0, Q5_0
  and Q6_K ones as int8 read in two int4 halves (1.25), an untied head likewise, an untied model's repacked
  embedding in the GPU's layout (it is gathered, never multiplied: GGUF_REPACKED_INT4 / INT8_BYTES), the rest
  and a tied embedding (the head is the same tensor) in bf16, norms in float32, and bf16 dense copies of every
  repacked projection for prompt rows when they fit torch_cpu_dense_copy_budget; plus its tokenizer
  (TORCH_TOKENIZER_BYTES_PER_TOKEN); its compute buffers are llama.cpp's formula for a prompt chunk (an upper
  bound there: the starter's 512-token chunks at up to 8192 tokens of context peaked 53-67 MiB above the loaded
  model, the formula says 167) plus the K and V its attention gathers for a full decode batch
  (torch_cpu_attention_bytes).
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
QUANT_BPW = {
    "F32": 32.0,
    "BF16": 16.0,
    "F16": 16.0,
    "Q8_0": 8.50,
    "Q6_K": 6.56,
    "Q5_K_M": 5.70,
    "Q5_K_S": 5.57,
    "Q5_0": 5.5,
    "Q5_1": 6.0,
    "Q4_K_M": 4.89,
    "Q4_K_S": 4.67,
    "Q4_0": 4.5,
    "Q4_1": 5.0,
    "Q3_K_M": 4.00,
    "Q3_K_L": 4.30,
    "Q3_K_S": 3.64,
    "Q2_K": 3.16,
}
LOWEST_DEFAULT_QUANT = "Q4_K_M"  # below this only when the user asks (quality drops fast)

# The torch engine's weight formats: bits per weight of the linear layers (embeddings and head stay 16-bit).
# W8A16: int8 + one fp16 scale per output channel; W4A16: int4 in groups of 128 with fp16 scale and zero;
# FP8: e4m3 + a per-channel scale, native on compute capability 8.9+.
TORCH_FORMAT_BPW = {"fp32": 32.0, "bf16": 16.0, "fp16": 16.0, "FP8": 8.0, "W8A16": 8.0, "W4A16": 4.25}
# "W4A16+attn8": precision per layer (backends/torch_engine/quantize.MIXED, weight_quant "int4+attn8"): the
# attention projections (Q, K, V, O) as W8A16, the MLP's (gate, up, down) as W4A16, embedding and head 16-bit as
# in the others, norms float32 as loaded; priced part by part (torch_mixed_bytes).  Named after the kind most
# weights take (the MLP holds ~80 % of a Llama-3-8B block's projections), "+" the part raised to 8 bits.
TORCH_MIXED = "W4A16+attn8"
TORCH_MIXED_PARTS = (("attention", "W8A16"), ("mlp", "W4A16"))
# "GGUF": the torch engine keeps a GGUF's own quantized (weight_map.REPACK_KIND) projection blocks (weight_quant
# "gguf"), repacked into groups of 32 with scales (and int4 offsets) in the 16-bit compute dtype: int4
# 0.5 + 2 x 2/32 bytes per weight (5.0 bits: Q4_0's 4.5 gains an offset, Q4_K's 4.5 loses its 6-bit sub-block
# packing), int8 1 + 2/32 (8.5 bits: Q8_0's own size; Q5_0's 5.5 grows to it, and on the CPU Q6_K's 6.56), on a
# GPU Q6_K as it is ("q6": 0.5 + 0.25 + 16/256 + 2/256 bytes, its 6.5625 bits; extra["gguf_q6"]).  A merged
# projection whose parts repack to different kinds keeps each part at its own (split_linear.py).  An untied
# model's head and embedding are held the same way when their types repack (a QuantLinear and a QuantEmbedding);
# projections that do not repack and a tied embedding (also the head) are 16-bit; RMSNorm weights float32.  Which
# projections repack comes from the file (shape.extra["gguf_repacked"]), the head's and embedding's kinds too
# (["gguf_head_kind"], ["gguf_embed_kind"]; on a GPU ["gguf_head_gpu_kind"], ["gguf_embed_gpu_kind"]).  Llama-3-8B
# Q4_K_M on a GPU: 4.9 GiB (6.6 with the mixed Q/K/V requantized to int8 and a 16-bit embedding and head, 5.3 with
# Q6_K as int8).
TORCH_GGUF = "GGUF"
GGUF_REPACKED_INT4_BYTES = 0.5 + 2 * 2 / 32
GGUF_REPACKED_INT8_BYTES = 1 + 2 / 32
GGUF_Q6_BYTES = 0.5 + 0.25 + 16 / 256 + 2 / 256  # low nibbles, high 2 bits, int8 sub-scales per 16, fp16 d per 256

# A GPTQ / AWQ folder (shape.extra["checkpoint_quant"], the format named by its label, "GPTQ-4bit-g128"): the
# torch engine holds its own packed integers (backends/torch_engine/gptq_awq.py), never 16-bit nor re-quantized.
# Bytes per weight as loaded, G the group size (a per-channel int4 weight regrouped to 128: quant_config
# .loaded_group), measured on tiny checkpoints (tests/hwprobe/test_planner_gptq_awq.py): on a GPU int4
# 0.5 + 2 x 2/G (16-bit scale and offset), int8 1 + 2/G; on a CPU with bf16 compute torch's packed kernels int4
# 0.5 + 2 x 2/G, per-channel int8 1 + 2/G, group-wise int8 as two int4 halves 1 + 8/G; with float32 compute (no
# packing) int4 0.5 + 2 x 4/G, int8 1 + 4/G; plus an int64 input order (8 bytes) per input feature of each
# act-order projection (one per merged Q/K/V or gate/up).  The rest as TORCH_GGUF's: 16-bit, norms float32.
CHECKPOINT_QUANT = "checkpoint_quant"
CHECKPOINT_PERM_BYTES = 8

# block of 32 + fp16 scale for q8_0 / q4_0; "f32": the torch engine on a CPU without bf16 (its KV follows the
# compute dtype there)
KV_BYTES_PER_ELEMENT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
TORCH_KV_BLOCK_TOKENS = 16  # backends/torch_engine/seams.BLOCK_SIZE (tests/hwprobe check they agree)

# The torch engine on the CPU (kernels/quant_matmul_cpu.py): int4 packed for torch's _weight_int4pack_mm_for_cpu
# with a bf16 scale and zero per group of 32; group-wise int8 (Q8_0) as two such int4 halves.
TORCH_CPU_INT4_BYTES = 0.5 + 2 * 2 / 32
TORCH_CPU_INT8_BYTES = 2 * TORCH_CPU_INT4_BYTES
# backends/torch_engine/model_runner.dense_copy_budget: the bf16 dense copies of the repacked projections (prompt
# rows run through them) are kept only when all of them fit min(1 GiB, a tenth of physical memory).
TORCH_CPU_DENSE_COPY_MAX_BYTES = 1 << 30
TORCH_CPU_DENSE_COPY_RAM_SHARE = 10
# The torch engine's tokenizer (the `tokenizers` BPE built from the GGUF's vocabulary and merges): the starter's
# 49152 tokens held 30 MiB after loading (43 MiB while building it, before the weights load: not the peak).
TORCH_TOKENIZER_BYTES_PER_TOKEN = 640

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
    # held besides the weights and never read by a decode step: the torch engine's bf16 dense copies of its
    # quantized projections on the CPU, which prompt rows run through (torch_cpu_weights)
    prefill_copy_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Bytes of the file (a tied head is not stored twice)."""
        return sum(self.layer_bytes) + self.embedding_bytes + self.other_bytes + (0 if self.tied else self.head_bytes)


def _params_per_layer(shape: ModelShape) -> int:
    q = shape.hidden_size * shape.n_heads * shape.head_dim
    kv = 2 * shape.hidden_size * shape.n_kv_heads * shape.head_dim
    o = shape.n_heads * shape.head_dim * shape.hidden_size
    ffn = 3 * shape.hidden_size * shape.ffn_size * max(shape.n_experts, 1)
    shared = 3 * shape.hidden_size * shape.shared_ffn_size + (shape.hidden_size if shape.shared_ffn_size else 0)
    return q + kv + o + ffn + shape.hidden_size * shape.n_experts + shared + 2 * shape.hidden_size


def routed_expert_share(shape: ModelShape) -> float:
    """Share of a block's parameters in its routed experts (0 for a dense model); shared experts, router,
    attention and norms are the rest."""
    if not shape.n_experts:
        return 0.0
    return 3 * shape.hidden_size * shape.ffn_size * shape.n_experts / _params_per_layer(shape)


def weights(shape: ModelShape, quant: str | None = None) -> WeightLayout:
    """Weight bytes by place.  quant=None: the file's exact bytes (needs shape.layer_bytes); a quant name: the
    GGUF ladder's bits per weight; a torch format (TORCH_FORMAT_BPW): linear layers at it, embeddings at 16;
    TORCH_MIXED: attention and MLP projections each at their part's bits (torch_mixed_bytes); TORCH_GGUF: the
    torch engine holding the file's own blocks (torch_gguf_weights)."""
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
    if quant == checkpoint_label(shape):
        return checkpoint_weights(shape, "gpu")
    if quant == TORCH_MIXED:
        embed = shape.vocab_size * shape.hidden_size * 2
        layer = sum(torch_mixed_bytes(shape)) + 2 * shape.hidden_size * 4
        return WeightLayout((layer,) * shape.n_layers, embed, embed, shape.hidden_size * 4, shape.tied_embeddings)
    embed_params = shape.vocab_size * shape.hidden_size
    per_layer = _params_per_layer(shape)
    if quant in TORCH_FORMAT_BPW:  # the embedding in the compute dtype: 16 bits, 32 for fp32
        layer_bpw, embed_bpw = TORCH_FORMAT_BPW[quant], max(16.0, TORCH_FORMAT_BPW[quant])
    else:
        layer_bpw = embed_bpw = QUANT_BPW[quant]
    layer = int(per_layer * layer_bpw / 8)
    embed = int(embed_params * embed_bpw / 8)
    return WeightLayout((layer,) * shape.n_layers, embed, embed, shape.hidden_size * 4, shape.tied_embeddings)


def attention_params(shape: ModelShape) -> int:
    """Weights of one block's attention projections (Q, K, V and O)."""
    q_and_o = 2 * shape.hidden_size * shape.n_heads * shape.head_dim
    return q_and_o + 2 * shape.hidden_size * shape.n_kv_heads * shape.head_dim


def torch_mixed_bytes(shape: ModelShape) -> tuple[int, int]:
    """(attention, MLP) bytes of one block in TORCH_MIXED: the attention projections at W8A16's bits a weight, the
    rest of the projections (gate, up, down) at W4A16's.  Llama-3-8B: 41.9 M x 1 B + 176.2 M x 0.53 B a block."""
    attention = attention_params(shape)
    parts = dict(TORCH_MIXED_PARTS)
    mlp = projection_params(shape) - attention
    return int(attention * TORCH_FORMAT_BPW[parts["attention"]] / 8), int(mlp * TORCH_FORMAT_BPW[parts["mlp"]] / 8)


def torch_format_lowest_bpw(fmt: str) -> float:
    """The fewest bits a weight any projection of torch format `fmt` holds (TORCH_MIXED: its MLP's): a GGUF is
    never re-quantized below its own bits."""
    if fmt == TORCH_MIXED:
        return min(TORCH_FORMAT_BPW[part] for _, part in TORCH_MIXED_PARTS)
    return TORCH_FORMAT_BPW[fmt]


def torch_gguf_weights(shape: ModelShape) -> WeightLayout | None:
    """What the torch engine holds on a GPU for a GGUF loaded with its own blocks (TORCH_GGUF), or None when no
    projection of the file repacks (an F16 file: that would just be bf16): the projections as kept (Q6_K as q6),
    an untied head and embedding at their GPU kinds' bytes (16-bit where their type does not repack)."""
    kept = shape.extra.get("gguf_repacked") if shape.extra else None
    if not kept or not any(n4 or n8 for n4, n8 in kept) or len(kept) != shape.n_layers:
        return None
    q6 = gguf_q6_params(shape)
    norms = 2 * shape.hidden_size
    projections = _params_per_layer(shape) - norms
    layers = tuple(
        int(
            n4 * GGUF_REPACKED_INT4_BYTES
            + (n8 - n6) * GGUF_REPACKED_INT8_BYTES
            + n6 * GGUF_Q6_BYTES
            + (projections - n4 - n8) * 2
            + norms * 4
        )
        for (n4, n8), n6 in zip(kept, q6)
    )
    embed_params = shape.vocab_size * shape.hidden_size
    embed = _repacked_bytes(
        embed_params, _embed_kind(shape, gpu=True), GGUF_REPACKED_INT4_BYTES, GGUF_REPACKED_INT8_BYTES
    )
    if shape.tied_embeddings:
        return WeightLayout(layers, embed, embed, shape.hidden_size * 4, True)
    head = _repacked_bytes(
        embed_params, _head_kind(shape, gpu=True), GGUF_REPACKED_INT4_BYTES, GGUF_REPACKED_INT8_BYTES
    )
    return WeightLayout(layers, embed, head, shape.hidden_size * 4, False)


def torch_gguf_kind_bytes(shape: ModelShape) -> dict[str, float]:
    """Bytes a decode step reads of each quantized kind a GPU load of the GGUF holds (torch_gguf_weights): the
    projections' int4, int8 and q6 blocks, and an untied head at its kind (the embedding is a few rows a step: not
    read whole).  The rest (16-bit projections, a 16-bit or tied head, norms) is not listed."""
    kept = shape.extra.get("gguf_repacked") if shape.extra else None
    if not kept or len(kept) != shape.n_layers:
        return {}
    n6 = sum(gguf_q6_params(shape))
    n4, n8 = sum(a for a, _ in kept), sum(b for _, b in kept) - n6
    out = {"int4": n4 * GGUF_REPACKED_INT4_BYTES, "int8": n8 * GGUF_REPACKED_INT8_BYTES, "q6": n6 * GGUF_Q6_BYTES}
    head = _head_kind(shape, gpu=True)
    if head is not None:
        out[head] += _repacked_bytes(
            shape.vocab_size * shape.hidden_size, head, GGUF_REPACKED_INT4_BYTES, GGUF_REPACKED_INT8_BYTES
        )
    return {kind: b for kind, b in out.items() if b}


def gguf_q6_params(shape: ModelShape) -> tuple[int, ...]:
    """Per layer, the weights of the int8-kept projections that are Q6_K, which a GPU load keeps as q6 (0 each for a
    hand-written shape that does not say)."""
    q6 = shape.extra.get("gguf_q6") if shape.extra else None
    return tuple(q6) if q6 and len(q6) == shape.n_layers else (0,) * shape.n_layers


def _repacked_bytes(n_weights: int, kind: str | None, int4_bytes: float, int8_bytes: float) -> int:
    """Bytes of `n_weights` held as repacked `kind` ("int4" / "int8" / "q6"), or 16-bit when None."""
    if kind is None:
        return n_weights * 2
    return int(n_weights * {"int4": int4_bytes, "q6": GGUF_Q6_BYTES}.get(kind, int8_bytes))


def checkpoint_quant(shape: ModelShape) -> dict | None:
    """A GPTQ / AWQ folder's planner facts (backends.quant_config.planner_extra), or None."""
    found = shape.extra.get(CHECKPOINT_QUANT) if shape.extra else None
    return found if found and len(found.get("layers", ())) == shape.n_layers else None


def checkpoint_label(shape: ModelShape) -> str | None:
    """The format of a GPTQ / AWQ folder ("GPTQ-4bit-g128", "AWQ-4bit-g128"), the only one it is planned in."""
    found = checkpoint_quant(shape)
    return found["label"] if found else None


def _checkpoint_bytes(cq: dict, n_weights: int, n_groups: int, where: str) -> float:
    """Packed weights and their scales as the engine holds them `where` ("gpu", "cpu_bf16", "cpu_fp32")."""
    if cq["bits"] == 4:
        per_group = 2 * (4 if where == "cpu_fp32" else 2)
        return 0.5 * n_weights + per_group * n_groups
    if where == "cpu_bf16" and not cq["per_channel"]:  # two int4 halves (kernels/quant_matmul_cpu.py)
        return n_weights + 8 * n_groups
    return n_weights + (4 if where == "cpu_fp32" else 2) * n_groups


def checkpoint_weights(shape: ModelShape, where: str = "gpu") -> WeightLayout:
    """What the torch engine holds for a GPTQ / AWQ folder `where` ("gpu", "cpu_bf16", "cpu_fp32"): the module
    comment above CHECKPOINT_QUANT.  The CPU's dense prompt copies and int8 head are torch_cpu_weights'."""
    cq = checkpoint_quant(shape)
    if cq is None:
        raise ValueError(f"{shape.name}: no GPTQ / AWQ checkpoint facts")
    dense = 4 if where == "cpu_fp32" else 2
    norms = 2 * shape.hidden_size
    projections = _params_per_layer(shape) - norms
    layers = tuple(
        int(_checkpoint_bytes(cq, n, g, where) + CHECKPOINT_PERM_BYTES * p + (projections - n) * dense + norms * 4)
        for n, g, p in cq["layers"]
    )
    embed = shape.vocab_size * shape.hidden_size * dense
    return WeightLayout(layers, embed, embed, shape.hidden_size * 4, shape.tied_embeddings)


def torch_cpu_dense_copy_budget(ram_total_bytes: int) -> int:
    """What the torch engine on the CPU may spend on dense copies of its quantized projections."""
    return min(TORCH_CPU_DENSE_COPY_MAX_BYTES, ram_total_bytes // TORCH_CPU_DENSE_COPY_RAM_SHARE)


def _head_kind(shape: ModelShape, gpu: bool = False) -> str | None:
    """The repacked kind of an untied GGUF head ("int4" / "int8", on a GPU also "q6"), or None when it stays
    16-bit: the head's type's kind as ModelSpec.to_shape gives it (extra["gguf_head_kind"], on a GPU
    ["gguf_head_gpu_kind"]), else judged by its bytes (_kind_of_bytes)."""
    if shape.tied_embeddings or not shape.output_bytes:
        return None
    return _end_kind(shape, "head", shape.output_bytes, gpu)


def _embed_kind(shape: ModelShape, gpu: bool = False) -> str | None:
    """The repacked kind of an untied model's GGUF token embedding ("int4" / "int8", on a GPU also "q6"), or None
    when it stays 16-bit (a tied one always does: the head reads it whole): extra["gguf_embed_kind"] (on a GPU
    ["gguf_embed_gpu_kind"]) as ModelSpec.to_shape gives it, else judged by its bytes (_kind_of_bytes)."""
    if shape.tied_embeddings or not shape.output_bytes or not shape.embedding_bytes:
        return None
    return _end_kind(shape, "embed", shape.embedding_bytes, gpu)


def _end_kind(shape: ModelShape, end: str, n_bytes: int, gpu: bool) -> str | None:
    extra = shape.extra or {}
    keys = (f"gguf_{end}_gpu_kind", f"gguf_{end}_kind") if gpu else (f"gguf_{end}_kind",)
    for key in keys:
        if key in extra:
            return extra[key]
    return _kind_of_bytes(n_bytes, shape, gpu)


def _kind_of_bytes(n_bytes: int, shape: ModelShape, gpu: bool = False) -> str | None:
    """A hand-written shape's vocab x hidden tensor judged by its bytes: 4.5 or 5.0 bits a weight is
    Q4_0/Q4_K/Q4_1 (int4), 8.5 Q8_0, 5.5 Q5_0/Q5_K, 6.0 Q5_1 and 6.5625 Q6_K (int8: backends/torch_engine/
    gguf_repack.py; Q6_K q6 on a GPU); anything else None (16-bit)."""
    bits = 8 * n_bytes / max(shape.vocab_size * shape.hidden_size, 1)
    if any(abs(bits - b) < 0.01 for b in (4.5, 5.0)):
        return "int4"
    if gpu and abs(bits - 6.5625) < 0.01:
        return "q6"
    return "int8" if any(abs(bits - b) < 0.01 for b in (8.5, 5.5, 6.0, 6.5625)) else None


def torch_cpu_weights(shape: ModelShape, fmt: str, ram_total_bytes: int, bf16: bool = True) -> WeightLayout:
    """What the torch engine holds in host RAM running on the CPU in `fmt`: TORCH_GGUF (bf16 compute, a GGUF's
    quantized projection blocks repacked (weight_map.REPACK_KIND),
    backends/torch_engine/model_runner.resolve_weight_quant "auto"), "bf16" or "fp32" (dense), or a GPTQ / AWQ
    folder's label (its packed weights, in `bf16` compute or float32).  Each term as the engine holds it (module
    docstring)."""
    if fmt == checkpoint_label(shape):
        return _cpu_checkpoint_weights(shape, ram_total_bytes, bf16)
    if fmt != TORCH_GGUF:
        return weights(shape, fmt)
    kept = shape.extra.get("gguf_repacked") if shape.extra else None
    if not kept or len(kept) != shape.n_layers:
        raise ValueError(f"{shape.name}: no GGUF projections the torch engine keeps as blocks")
    norms = 2 * shape.hidden_size
    projections = _params_per_layer(shape) - norms
    layers = tuple(
        int(n4 * TORCH_CPU_INT4_BYTES + n8 * TORCH_CPU_INT8_BYTES + (projections - n4 - n8) * 2 + norms * 4)
        for n4, n8 in kept
    )
    embed_params = shape.vocab_size * shape.hidden_size
    # the embedding is gathered, not packed for a kernel: the generic layout, scales in bf16 (quant_embedding.py)
    embed = _repacked_bytes(embed_params, _embed_kind(shape), GGUF_REPACKED_INT4_BYTES, GGUF_REPACKED_INT8_BYTES)
    head_kind = _head_kind(shape)
    head = embed if shape.tied_embeddings else embed_params * 2
    if head_kind is not None:
        head = _repacked_bytes(embed_params, head_kind, TORCH_CPU_INT4_BYTES, TORCH_CPU_INT8_BYTES)
    quantized = sum(n4 + n8 for n4, n8 in kept) + (embed_params if head_kind else 0)
    copies = 2 * quantized if 2 * quantized <= torch_cpu_dense_copy_budget(ram_total_bytes) else 0
    # a bf16 head (tied, or untied but not repacked) also gets an int8 copy for decode rows: 1 byte a weight and a
    # float32 scale a vocabulary row (backends/torch_engine/cpu_head.py)
    int8_head = 0 if head_kind else embed_params + 4 * shape.vocab_size
    return WeightLayout(layers, embed, head, shape.hidden_size * 4 + int8_head, shape.tied_embeddings, copies)


def _cpu_checkpoint_weights(shape: ModelShape, ram_total_bytes: int, bf16: bool) -> WeightLayout:
    """A GPTQ / AWQ folder on the CPU: checkpoint_weights, plus dense copies of the packed projections for prompt
    rows when they fit torch_cpu_dense_copy_budget, and with bf16 compute an int8 copy of the 16-bit head (the
    same terms as a GGUF's: torch_cpu_weights)."""
    layout = checkpoint_weights(shape, "cpu_bf16" if bf16 else "cpu_fp32")
    packed = sum(n for n, _, _ in checkpoint_quant(shape)["layers"])  # type: ignore[index]
    copies = (2 if bf16 else 4) * packed
    copies = copies if copies <= torch_cpu_dense_copy_budget(ram_total_bytes) else 0
    int8_head = shape.vocab_size * shape.hidden_size + 4 * shape.vocab_size if bf16 else 0
    other = layout.other_bytes + int8_head
    return WeightLayout(layout.layer_bytes, layout.embedding_bytes, layout.head_bytes, other, layout.tied, copies)


def torch_tokenizer_bytes(shape: ModelShape) -> int:
    return TORCH_TOKENIZER_BYTES_PER_TOKEN * shape.vocab_size


def projection_params(shape: ModelShape) -> int:
    """Weights of one block's projections (its parameters but the norms)."""
    return _params_per_layer(shape) - 2 * shape.hidden_size


def gguf_repacked_shares(shape: ModelShape) -> tuple[float, float]:
    """Shares of the projection weights a TORCH_GGUF load keeps as int4 and as int8 blocks (for the reasons)."""
    kept = shape.extra.get("gguf_repacked") if shape.extra else None
    if not kept:
        return 0.0, 0.0
    projections = max(projection_params(shape) * shape.n_layers, 1)
    return sum(n4 for n4, _ in kept) / projections, sum(n8 for _, n8 in kept) / projections


def kv_cells(shape: ModelShape, ctx: int, *, sliding: bool, swa_full: bool, n_ubatch: int = 512) -> int:
    """KV cells one layer keeps: the context, or for a sliding-window layer with a windowed cache the window."""
    if sliding and not swa_full and shape.sliding_window:
        return min(ctx, int(math.ceil((shape.sliding_window + n_ubatch) / 256) * 256))
    return ctx


def kv_bytes(
    shape: ModelShape, ctx: int, kv_type: str = "f16", *, swa_full: bool = LLAMA_CPP_SWA_FULL, n_ubatch: int = 512
) -> int:
    """KV cache of all layers for one sequence of `ctx` tokens."""
    per_cell = 2 * shape.n_kv_heads * shape.head_dim * KV_BYTES_PER_ELEMENT[kv_type]
    n_swa = shape.sliding_window_layers if shape.sliding_window else 0
    swa = kv_cells(shape, ctx, sliding=True, swa_full=swa_full, n_ubatch=n_ubatch)
    return int(per_cell * ((shape.n_layers - n_swa) * ctx + n_swa * swa))


def kv_bytes_per_token(shape: ModelShape, kv_type: str = "f16") -> int:
    """K and V of one token in every layer (no sliding window: the torch engine's pool)."""
    return int(2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * KV_BYTES_PER_ELEMENT[kv_type])


def torch_kv_pool_bytes(shape: ModelShape, ctx: int, kv_type: str, max_num_seqs: int, free_bytes: int) -> int:
    """The torch engine's KV pool, in whole blocks: `free_bytes` (the device's budget left after weights,
    compute buffers and overhead) capped at max_num_seqs sequences of `ctx` tokens, and never below one such
    sequence (a pool that large does not fit `free_bytes`: the plan then lowers the context or says so)."""
    block = TORCH_KV_BLOCK_TOKENS * kv_bytes_per_token(shape, kv_type)
    seq_blocks = -(-ctx // TORCH_KV_BLOCK_TOKENS)
    blocks = min(max(max_num_seqs, 1) * seq_blocks, max(free_bytes, 0) // block)
    return max(blocks, seq_blocks) * block


def torch_cpu_attention_bytes(shape: ModelShape, ctx: int, max_num_seqs: int, kv_type: str = "f16") -> int:
    """What the torch engine's CPU attention (kernels/attention.paged_attention_torch) allocates on top of the
    prompt chunk's activations (compute_bytes): each layer gathers the K and V blocks of every sequence it
    attends over, up to max_num_seqs sequences of ctx tokens in one decode step, plus a float32 mask bias per
    token.  On a GPU the Triton kernel reads the blocks in place.  A 7B without GQA decoding 16 sequences of
    4096 tokens gathers 1 GiB a layer; the starter at 16 x 8192, 96 MiB."""
    tokens = max(max_num_seqs, 1) * ctx
    return tokens * kv_bytes_per_token(shape, kv_type) // max(shape.n_layers, 1) + 4 * tokens


def compute_bytes(
    shape: ModelShape, ctx: int, *, n_ubatch: int = 512, flash_attn: bool = False, with_logits: bool = True
) -> int:
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
        layers *= 1 - routed_expert_share(shape) * (1 - shape.n_experts_used / shape.n_experts)
    return layers + layout.head_bytes
