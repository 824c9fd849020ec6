"""A merged projection (Q/K/V, gate/up) held as its parts, each quantized at its own kind.

Why: a GGUF mixes block types inside one merged projection (llama.cpp's Q4_K_M: Q4_K Q and K beside a Q6_K V in
half the layers; gate/up likewise in some files).  One QuantLinear holds one kind, so the loader used to requantize
the int4 parts to int8 (gguf_repack.merge_kept before issue 42): 8.5 bits for weights the file stores in 4.5.
SplitLinear keeps each part as the loader read it, one QuantLinear a part, and concatenates their outputs along
the features: to the model code (models/layers.py splits qkv_proj's output into Q, K and V, chunks gate_up_proj's
into gate and up) it is the merged projection, out = x @ cat(W_parts)^T + cat(b_parts).

Parts that share a kind stay one QuantLinear (concat_rows): the split costs a matmul launch a part and one cat a
call, paid only where the kinds differ.  The CPU preparation (dense prompt copies, packing: quantize.
prepare_for_cpu) and the prepared-weight cache (prepared.py) see the parts as the QuantLinears they are; tensor
parallelism cuts each part's rows (tp/layers.py).
"""

from __future__ import annotations

import torch
from torch import nn


class SplitLinear(nn.Module):
    """y = cat([part(x) for part in parts], dim=-1): `parts` (QuantLinear or nn.Linear) read the same inputs; the
    output rows are theirs in order (Q, K, V or gate, up)."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        if not parts or any(p.in_features != parts[0].in_features for p in parts):
            raise ValueError("the parts of a split projection read the same inputs")
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)

    @property
    def widths(self) -> list[int]:
        """Output rows of each part, in order."""
        return [p.out_features for p in self.parts]

    @property
    def bias(self) -> torch.Tensor | None:
        """The merged bias (the parts' biases in order), or None when the parts have none (a merged projection's
        parts all have one or none: the config's qkv_bias)."""
        biases = [p.bias for p in self.parts]
        return None if any(b is None for b in biases) else torch.cat(biases)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, parts {self.widths}"
