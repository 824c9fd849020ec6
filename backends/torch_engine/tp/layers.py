"""Module surgery: turn a loaded model into this rank's tensor-parallel share (Megatron-style splits).

Works on the shared layers' names (models/llama.py): embed, layers[i].attn.qkv_proj / o_proj,
layers[i].mlp.gate_up_proj / down_proj, lm_head, and the attention's n_heads / n_kv_heads / split.

- qkv_proj: column-parallel by head (this rank's query heads, then its KV heads' K and V rows).  A split
  projection (split_linear.SplitLinear: parts of different kinds) keeps its parts, each cut to this rank's rows.
- o_proj, down_proj: row-parallel (this rank's input columns), then one all-reduce each: the only two
  collectives of a layer.
- gate_up_proj: column-parallel (this rank's FFN rows of gate and of up).
- embed: vocabulary-parallel (rows of this rank's slice; ids outside it give zeros; all-reduce); a quantized
  embedding (quant_embedding.QuantEmbedding) keeps its slice quantized.
- lm_head: vocabulary-parallel (logits of this rank's slice; gathered on rank 0).

Quantized projections (QuantWeight: the GGUF Q4/Q8 blocks and the int8/int4/fp8 layouts) keep their scales
per output row and per group of `group_size` inputs, so output rows slice freely and input columns slice on
whole groups (q6, GGUF Q6_K as it is, on whole 256-weight blocks: QuantWeight.column_unit); a column split that
would cut one dequantizes that projection (dense in the model's dtype).
Applied after loading and before the CPU packing (quantize.prepare_for_cpu), which then packs the shares.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from backends.errors import ConfigError
from backends.torch_engine.quant_embedding import QuantEmbedding
from backends.torch_engine.quantize import QuantLinear
from backends.torch_engine.split_linear import SplitLinear
from backends.torch_engine.tp.comm import Comm
from backends.torch_engine.tp.partition import HeadShard, balanced, ffn_shards, head_shards
from kernels.quant_matmul import QuantWeight, concat_rows, dequantize

# Output-row shares (FFN rows, vocabulary rows) are whole multiples of this where they can be: torch's packed
# CPU int4 kernels take N in multiples of 16, and GPU matmuls like aligned shapes.
ROW_UNIT = 64


def _rows(w: torch.Tensor | QuantWeight, lo: int, hi: int) -> torch.Tensor | QuantWeight:
    """Output rows [lo, hi), copied: a view would keep the whole tensor alive."""
    if isinstance(w, torch.Tensor):
        return w[lo:hi].clone()
    return w.map_rows(lambda t: t[lo:hi].clone())


def _cat_rows(parts: list) -> torch.Tensor | QuantWeight:
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts, dim=0).contiguous()
    return concat_rows(parts)


def _cols(w: torch.Tensor | QuantWeight, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor | QuantWeight:
    """Input columns [lo, hi): quantized when both ends fall on the weight's column_unit (a group; q6's 256-weight
    block), else dense in `dtype`."""
    if isinstance(w, torch.Tensor):
        return w[:, lo:hi].contiguous()
    cut = w.columns(lo, hi)
    return dequantize(w)[:, lo:hi].to(dtype).contiguous() if cut is None else cut


def _weight(m: nn.Module) -> torch.Tensor | QuantWeight:
    if isinstance(m, QuantLinear):
        if m._cpu is not None or m._dense is not None or m.input_scale is not None:
            raise RuntimeError("tensor-parallel surgery runs before CPU packing and without AWQ scales")
        return m.weight
    return m.weight.data


def _linear(w: torch.Tensor | QuantWeight, bias: torch.Tensor | None) -> nn.Module:
    if isinstance(w, QuantWeight):
        return QuantLinear(w, bias)
    m = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")
    m.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        m.bias = nn.Parameter(bias, requires_grad=False)
    return m


class RowParallel(nn.Module):
    """y = all_reduce(x_local @ W_local^T) (+ bias once): x_local is this rank's share of the input features."""

    def __init__(self, inner: nn.Module, bias: torch.Tensor | None, comm: Comm) -> None:
        super().__init__()
        self.inner, self.comm = inner, comm
        self.register_buffer("bias", bias if comm.rank == 0 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce(self.inner(x))
        return y if self.bias is None else y + self.bias.to(y.dtype)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, stop) of the table (a dense weight, or a QuantEmbedding of just those rows); a token outside
    them contributes zeros; the all-reduce completes it."""

    def __init__(self, table: torch.Tensor | QuantEmbedding, start: int, comm: Comm) -> None:
        super().__init__()
        if isinstance(table, QuantEmbedding):
            self.quantized: QuantEmbedding | None = table
            self.rows = table.num_embeddings
        else:
            self.quantized = None
            self.weight = nn.Parameter(table, requires_grad=False)
            self.rows = table.shape[0]
        self.start, self.comm = start, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.rows)
        local = local.clamp(0, self.rows - 1)
        x = nn.functional.embedding(local, self.weight) if self.quantized is None else self.quantized(local)
        x = x * inside.unsqueeze(-1).to(x.dtype)  # (num_tokens, hidden)
        return self.comm.all_reduce(x)


def _embed_table(embed: nn.Module) -> torch.Tensor | QuantEmbedding:
    """What VocabParallelEmbedding takes of a loaded embedding: its dense weight, or the QuantEmbedding itself."""
    return embed if isinstance(embed, QuantEmbedding) else embed.weight.data


class VocabParallelHead(nn.Module):
    """Logits of rows [start, stop) of the vocabulary; rank 0 gets all of them side by side (other ranks get
    an empty (rows, 0) tensor: they never sample)."""

    def __init__(self, inner: nn.Module, widths: list[int], comm: Comm) -> None:
        super().__init__()
        self.inner, self.widths, self.comm = inner, widths, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = self.comm.gather_columns(self.inner(x), self.widths)
        return full if full is not None else x.new_empty(x.shape[0], 0)


def shard_model(model: nn.Module, comm: Comm) -> HeadShard:
    """Replace this rank's modules in place with its shares; returns its heads.  The model's dtype is its
    embedding's (dense fallbacks of quantized projections take it)."""
    cfg = model.cfg
    rank, world = comm.rank, comm.world
    heads = head_shards(cfg.n_heads, cfg.n_kv_heads, world)[rank]
    hd = cfg.head_dim
    dtype = model.embed.dtype if isinstance(model.embed, QuantEmbedding) else model.embed.weight.dtype
    for layer in model.layers:
        if not hasattr(layer.mlp, "gate_up_proj"):  # e.g. a mixture of experts: no rule for it here yet
            raise ConfigError(
                f"tensor parallelism splits dense MLPs only, not {type(layer.mlp).__name__}", "drop --tensor-parallel"
            )
        _shard_attention(layer.attn, heads, hd, cfg, comm, dtype)
        _shard_mlp(layer.mlp, cfg.ffn_size, comm, dtype)
    _shard_vocab(model, cfg, comm)
    return heads


def _shard_attention(attn: nn.Module, h: HeadShard, hd: int, cfg, comm: Comm, dtype: torch.dtype) -> None:
    q_size, kv_size = cfg.n_heads * hd, cfg.n_kv_heads * hd
    spans = [
        (h.q_start * hd, h.q_stop * hd),
        (q_size + h.kv_start * hd, q_size + h.kv_stop * hd),
        (q_size + kv_size + h.kv_start * hd, q_size + kv_size + h.kv_stop * hd),
    ]
    attn.qkv_proj = _rows_of(attn.qkv_proj, spans)
    attn.n_heads, attn.n_kv_heads = h.num_heads, h.num_kv_heads
    attn.split = (h.num_heads * hd, h.num_kv_heads * hd, h.num_kv_heads * hd)
    o = attn.o_proj
    attn.o_proj = RowParallel(
        _linear(_cols(_weight(o), h.q_start * hd, h.q_stop * hd, dtype), None),
        None if o.bias is None else o.bias.data,
        comm,
    )


def _shard_mlp(mlp: nn.Module, ffn: int, comm: Comm, dtype: torch.dtype) -> None:
    down = _weight(mlp.down_proj)
    group = down.column_unit if isinstance(down, QuantWeight) and down.group_size < down.in_features else 1
    unit = math.lcm(group, ROW_UNIT)
    lo, hi = ffn_shards(ffn, comm.world, unit)[comm.rank]
    mlp.gate_up_proj = _rows_of(mlp.gate_up_proj, [(lo, hi), (ffn + lo, ffn + hi)])
    mlp.down_proj = RowParallel(
        _linear(_cols(down, lo, hi, dtype), None), None if mlp.down_proj.bias is None else mlp.down_proj.bias.data, comm
    )


def _rows_of(m: nn.Module, spans: list[tuple[int, int]]) -> nn.Module:
    """Output rows `spans` of a column-parallel projection as a new module (with its bias rows).  A SplitLinear
    keeps its parts, each cut to the spans that fall inside it (a span never crosses parts: Q, K, V and gate, up
    are cut apart)."""
    if isinstance(m, SplitLinear):
        parts, at = [], 0
        for part in m.parts:
            inside = [(lo - at, hi - at) for lo, hi in spans if at <= lo and hi <= at + part.out_features]
            parts.append(_rows_of(part, inside))
            at += part.out_features
        return SplitLinear(parts)
    w, b = _weight(m), m.bias
    bias = None if b is None else torch.cat([b.data[lo:hi] for lo, hi in spans])
    return _linear(_cat_rows([_rows(w, lo, hi) for lo, hi in spans]), bias)


def _shard_vocab(model: nn.Module, cfg, comm: Comm) -> None:
    spans = balanced(cfg.vocab_size, comm.world, ROW_UNIT)
    lo, hi = spans[comm.rank]
    widths = [b - a for a, b in spans]
    embed = model.embed
    if isinstance(embed, QuantEmbedding):
        table: torch.Tensor | QuantEmbedding = QuantEmbedding(_rows(embed.weight, lo, hi), embed.dtype)  # type: ignore[arg-type]
    else:
        table = embed.weight.data[lo:hi].clone()
    model.embed = VocabParallelEmbedding(table, lo, comm)
    if cfg.tied_embeddings:
        head = _linear(model.embed.weight.data, None)
        head.weight = model.embed.weight  # still one tensor: the slice is held once
    else:
        head = _linear(_rows(_weight(model.lm_head), lo, hi), None)
        if hasattr(model.lm_head, "dense_min_rows"):
            head.dense_min_rows = model.lm_head.dense_min_rows
    model.lm_head = VocabParallelHead(head, widths, comm)


def pool_kv_heads(spec, world: int) -> int:
    """The most KV heads any rank holds: what each rank's KV pool is sized by (parts.kv_pool_blocks)."""
    return max(s.num_kv_heads for s in head_shards(spec.n_heads, spec.n_kv_heads, world))


# ---- sharding while reading (issue 25): each rank reads only its rows / columns from the file -----------------


@dataclass(frozen=True)
class ReadPlan:
    """One rank's share of every weight, as the loader reads it: `select(target, shard)` gives the output-row
    spans and the input-column span of a file tensor (None: all of them).  Rows of a merged projection are its
    parts' own rows (the file holds Q, K, V and gate, up apart; Phi-3's fused tensors take several spans)."""

    heads: HeadShard
    head_dim: int
    n_heads: int
    n_kv_heads: int
    ffn: tuple[int, int]  # this rank's FFN rows [lo, hi)
    ffn_size: int
    vocab: tuple[int, int]  # this rank's vocabulary rows [lo, hi)
    vocab_widths: tuple[int, ...]  # every rank's, for the head's gather

    def select(self, target: str, shard: str | None) -> tuple[list[tuple[int, int]] | None, tuple[int, int] | None]:
        h, hd = self.heads, self.head_dim
        q = (h.q_start * hd, h.q_stop * hd)
        kv = (h.kv_start * hd, h.kv_stop * hd)
        lo, hi = self.ffn
        name = target.rsplit(".", 1)[0]  # the module: "layers.3.attn.qkv_proj"
        if name.endswith("attn.qkv_proj"):
            if shard == "q":
                return [q], None
            if shard in ("k", "v"):
                return [kv], None
            q_size, kv_size = self.n_heads * hd, self.n_kv_heads * hd  # fused (Phi-3): Q, K, V rows in one tensor
            return [q, (q_size + kv[0], q_size + kv[1]), (q_size + kv_size + kv[0], q_size + kv_size + kv[1])], None
        if name.endswith("mlp.gate_up_proj"):
            if shard in ("gate", "up"):
                return [(lo, hi)], None
            return [(lo, hi), (self.ffn_size + lo, self.ffn_size + hi)], None  # fused (Phi-3)
        if target.endswith("attn.o_proj.weight"):
            return None, q
        if target.endswith("mlp.down_proj.weight"):
            return None, (lo, hi)
        if target in ("embed.weight", "lm_head.weight"):
            return [self.vocab], None
        return None, None  # norms, the row-parallel layers' biases (added once, by rank 0)

    def local_config(self, cfg):  # type: ignore[no-untyped-def]
        """The DecoderConfig of this rank's share: its heads, FFN rows and vocabulary rows."""
        return dataclasses.replace(
            cfg,
            n_heads=self.heads.num_heads,
            n_kv_heads=self.heads.num_kv_heads,
            ffn_size=self.ffn[1] - self.ffn[0],
            vocab_size=self.vocab[1] - self.vocab[0],
        )


def read_plan(cfg, rank: int, world: int, down_group: int = 1) -> ReadPlan:  # type: ignore[no-untyped-def]
    """This rank's ReadPlan: the same shares shard_model cuts from a whole model (heads by KV group, FFN rows
    on whole quantization groups of down_proj's inputs (`down_group`, 1 when dense), vocabulary rows)."""
    heads = head_shards(cfg.n_heads, cfg.n_kv_heads, world)[rank]
    ffn = ffn_shards(cfg.ffn_size, world, math.lcm(down_group, ROW_UNIT))[rank]
    spans = balanced(cfg.vocab_size, world, ROW_UNIT)
    return ReadPlan(
        heads,
        cfg.head_dim,
        cfg.n_heads,
        cfg.n_kv_heads,
        ffn,
        cfg.ffn_size,
        spans[rank],
        tuple(b - a for a, b in spans),
    )


def wrap_loaded_shares(model: nn.Module, plan: ReadPlan, comm: Comm) -> HeadShard:
    """A model built from this rank's config and filled with its shares: add the collectives (o_proj and
    down_proj all-reduce, the embedding's all-reduce, the head's gather).  Returns its heads."""
    for layer in model.layers:
        for parent, name in ((layer.attn, "o_proj"), (layer.mlp, "down_proj")):
            m = getattr(parent, name)
            bias = m.bias.data if isinstance(m.bias, torch.Tensor) else None
            setattr(parent, name, RowParallel(_linear(_weight(m), None), bias, comm))
    head = model.lm_head
    model.embed = VocabParallelEmbedding(_embed_table(model.embed), plan.vocab[0], comm)
    if model.cfg.tied_embeddings:
        head = _linear(model.embed.weight.data, None)
        head.weight = model.embed.weight
    model.lm_head = VocabParallelHead(head, list(plan.vocab_widths), comm)
    return plan.heads
