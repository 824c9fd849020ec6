"""A token embedding kept in its repacked GGUF form (kernels/quant_matmul.py's int4 / int8 layouts, groups of 32,
or on a GPU Q6_K as it is, "q6").

Why: the embedding is a table the model reads a few rows of a step, yet held dense it is vocab x hidden x 2 bytes,
1 GiB for Llama 3's 128256 x 4096, more than the file's Q4_K rows (282 MiB).  An untied model's embedding is
used for nothing else, so the loader keeps it as the file's blocks repacked (gguf_repack.repack_gguf: Q4_0 / Q4_1
/ Q4_K int4, Q8_0 / Q5_0 / Q6_K and the rest int8: weight_map.REPACK_KIND; Q6_K as q6 on a GPU) and this module
gathers the rows of the step's tokens (every field of every layout is per row: QuantWeight.map_rows) and
dequantizes only them, with the layouts' own reference (kernels/quant_matmul.dequantize).  A tied embedding
stays dense: the head reads it whole every step.

The rows are exactly those of the dense lookup of the same repacked weights (dequantize(w).to(dtype)[ids]):
the same float32 products and sums, element by element, then one rounding to the compute dtype.  Torch ops only,
shapes fixed by the number of ids, no host sync: a CUDA graph captures it.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.quant_matmul import QuantWeight, dequantize, held_weight, register_weight


class QuantEmbedding(nn.Module):
    """embed(ids) = dequantize(weight)[ids] in `dtype`, holding `weight` (int4, int8 or q6, vocab rows) quantized.

    Buffers qweight, scales, offsets (int4 only), qhigh and super_scales (q6 only) as QuantLinear names them, so
    byte counts and the prepared-weight cache see them like any module's buffers."""

    KINDS = ("int4", "int8", "q6")  # the layouts it gathers from

    def __init__(self, weight: QuantWeight, dtype: torch.dtype) -> None:
        super().__init__()
        if weight.kind not in self.KINDS or weight.in_features % weight.group_size:
            raise ValueError(f"a quantized embedding is int4, int8 or q6 in whole groups, not {weight.kind}")
        self.kind = weight.kind
        self.group_size = weight.group_size
        self.num_embeddings = weight.out_features
        self.embedding_dim = weight.in_features
        self.dtype = dtype
        register_weight(self, weight)

    @property
    def weight(self) -> QuantWeight:
        """The whole table as a QuantWeight (tensor parallelism cuts its rows: tp/layers.py)."""
        return held_weight(self, self.kind, self.group_size, self.embedding_dim, self.num_embeddings)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (...,) int64 -> (..., embedding_dim) in self.dtype."""
        flat = ids.reshape(-1)
        rows = dequantize(self.weight.map_rows(lambda t: t.index_select(0, flat)))
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.kind}, group_size={self.group_size}"
