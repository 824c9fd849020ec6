"""The lm head of a CPU decode step as int8 (kernels/int8_rows_cpu.py), a transform applied after loading.

A single-stream decode step reads the whole head: the starter's is its tied 49152 x 576 bf16 embedding, 56 MiB,
and on the 2-core Zen 4 machine (loaded) torch's bf16 matrix-vector product took 6.9-11 ms of CPU per call,
about a third of the step, where the int8 rows kernel takes 1.1-1.3 ms.  Rows follow quantize.QUANTIZED_ROWS
as QuantLinear's do: a runner step's decode rows take the int8 kernel (which gives a row the same bits alone or
in any batch), prompt rows (perplexity, prompt log-probabilities) the dense weight; outside a step, fewer than
DENSE_MIN_ROWS rows take int8.  The dense weight is the module's own (for a tied head: the embedding, no copy);
the int8 copy adds 1 byte per weight and 4 per vocabulary row (hwprobe.memory counts it).

Accuracy on the starter (tests/data/english.txt, 1533 tokens, against a float32 head): ΔPPL -0.006 and top-1
0.979 (the bf16 head: -0.012, 0.978); mean KL 0.0008 nats (bf16: 0.0003; llama.cpp vs the torch engine: 0.0035).
"""

from __future__ import annotations

import torch
from torch import nn

from backends.torch_engine.quantize import QUANTIZED_ROWS
from kernels.int8_rows_cpu import (
    Int8RowsWeight,
    available,
    batch_invariant,
    int8_rows_matmul,
    pack_int8_rows,
    quantize_int8_rows,
)

DENSE_MIN_ROWS = 32  # outside a runner step, inputs of this many rows take the dense weight


class Int8RowsHead(nn.Module):
    """forward(hidden (n, K)) -> float32 logits (n, N); `weight` is the dense (N, K) weight (shared, not copied)."""

    def __init__(self, weight: torch.Tensor, int8: Int8RowsWeight) -> None:
        super().__init__()
        self.weight = weight  # a Parameter when tied: registered, so the module's state shows it
        self.int8 = int8
        self.in_features, self.out_features = int8.in_features, int8.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        quantized = QUANTIZED_ROWS.get()
        if quantized is None:
            quantized = rows if rows < DENSE_MIN_ROWS else 0
        try:
            if quantized >= rows:
                return int8_rows_matmul(x, self.int8)
            dense = torch.nn.functional.linear(x, self.weight.to(x.dtype)).float()
            if quantized <= 0:
                return dense
            return torch.cat([int8_rows_matmul(x[:quantized], self.int8), dense[quantized:]])
        except RuntimeError:
            # fbgemm refuses non-finite input (its min/max check): the dense head gives such rows the NaN or
            # inf logits they would have had, and the sampler's own checks take it from there
            return torch.nn.functional.linear(x, self.weight.to(x.dtype)).float()

    @property
    def nbytes(self) -> int:
        """Bytes the int8 copy adds (the dense weight is counted where it lives)."""
        return self.int8.nbytes

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, int8 rows (fbgemm) + dense"


def install_int8_head(model: nn.Module) -> tuple[int, str | None]:
    """Replace a dense, bias-free `model.lm_head` on the CPU by an Int8RowsHead.  Returns (bytes added, why not:
    None when installed)."""
    head = getattr(model, "lm_head", None)
    if type(head) is not nn.Linear or head.bias is not None:
        return 0, "the head is not a plain dense linear"
    if head.weight.is_cuda or head.weight.device.type != "cpu":
        return 0, "the head is not on the CPU"
    if not available():
        return 0, "this torch has no fbgemm dynamic quantized linear"
    q, scales = quantize_int8_rows(head.weight.detach())
    try:
        int8 = pack_int8_rows(q, scales)
        why = batch_invariant(int8)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:  # a torch whose quantized ops changed
        return 0, f"the int8 head could not be packed ({type(exc).__name__}: {str(exc)[:120]})"

    if why is not None:
        return 0, f"the int8 head failed its check on this CPU ({why})"
    int8.qweight = None  # fbgemm's packed copy holds the weight; keeping both would double it
    new = Int8RowsHead(head.weight, int8)
    model.lm_head = new
    return new.nbytes, None
