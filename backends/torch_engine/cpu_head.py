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
# The load-time check packs the head's first and last rows only (an odd count, so fbgemm's column blocks end in a
# partial one, as the whole head's may): packing all 49152 rows of the starter's head took 0.23-0.29 s of a
# 2.6 s start on the 2-core Xeon, so the whole head is packed at its first int8 call (Int8RowsHead.packed).
CHECK_ROWS = 1023


class Int8RowsHead(nn.Module):
    """forward(hidden (n, K)) -> float32 logits (n, N); `weight` is the dense (N, K) weight (shared, not copied).

    fbgemm's packed copy is made at the first call that takes int8 rows (`packed()`; the runner calls it before a
    decode step's forward, so the step's time stays the kernel's), on the thread that makes that call: the
    engine thread, whose OpenMP team every torch op of the engine uses (a prepack on a background thread started
    a second team: backends/torch_engine/backend.py says what that costs).  Until then the head holds the int8
    rows and scales (the prepared-weight cache's mapped tensors on a warm start).  The first token of a reply
    is a prompt row (dense), so a reply's first token never waits for the prepack.  A prepack that fails leaves
    every row on the dense weight; no int8 row was produced before it, so a row's bits still never depend on
    the batch or on when it ran."""

    def __init__(self, weight: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # a Parameter when tied: registered, so the module's state shows it
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = (qweight, scales)  # until packed
        self._int8: Int8RowsWeight | None = None
        self.off: str | None = None  # why the int8 rows are not used (a failed prepack), else None
        self.out_features, self.in_features = qweight.shape

    def packed(self) -> Int8RowsWeight | None:
        """fbgemm's packed head, packing it on the first call; None when the prepack failed (then `off` says why)."""
        if self._rows is not None:
            qweight, scales = self._rows
            self._rows = None
            try:
                int8 = pack_int8_rows(qweight, scales)
            except (RuntimeError, NotImplementedError, AttributeError, ValueError) as exc:
                self.off = f"the int8 head could not be packed ({type(exc).__name__}: {str(exc)[:120]})"
                return None
            int8.qweight = None  # fbgemm's packed copy holds the weight; keeping both would double it
            self._int8 = int8
        return self._int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        quantized = QUANTIZED_ROWS.get()
        if quantized is None:
            quantized = rows if rows < DENSE_MIN_ROWS else 0
        int8 = self.packed() if quantized > 0 else None
        if int8 is None:
            quantized = 0
        try:
            if int8 is not None and quantized >= rows:
                return int8_rows_matmul(x, int8)
            dense = torch.nn.functional.linear(x, self.weight.to(x.dtype)).float()
            if int8 is None:
                return dense
            return torch.cat([int8_rows_matmul(x[:quantized], int8), dense[quantized:]])
        except RuntimeError:
            # fbgemm refuses non-finite input (its min/max check): the dense head gives such rows the NaN or
            # inf logits they would have had, and the sampler's own checks take it from there
            return torch.nn.functional.linear(x, self.weight.to(x.dtype)).float()

    @property
    def nbytes(self) -> int:
        """Bytes the int8 copy adds (the dense weight is counted where it lives): 1 per weight, 4 per row."""
        return self.in_features * self.out_features + 4 * self.out_features

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, int8 rows (fbgemm) + dense"


def head_rows(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The int8 rows and scales of `model.lm_head` (quantize_int8_rows), or None where install_int8_head would
    refuse the head: what the prepared-weight cache keeps beside the model (cpu_load.py)."""
    if _refusal(getattr(model, "lm_head", None)) is not None:
        return None
    return quantize_int8_rows(model.lm_head.weight.detach())


def install_int8_head(
    model: nn.Module, rows: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[int, str | None]:
    """Replace a dense, bias-free `model.lm_head` on the CPU by an Int8RowsHead.  `rows`: its int8 rows and
    scales when the caller has them (head_rows' result, e.g. from the prepared-weight cache), else they are
    quantized here.  Returns (bytes added, why not: None when installed).  Checks on this machine that a row gets
    the same bits alone and in a batch (kernels/int8_rows_cpu.batch_invariant) on CHECK_ROWS of the head's rows;
    the whole head is packed at its first int8 call."""
    head = getattr(model, "lm_head", None)
    why = _refusal(head)
    if why is not None:
        return 0, why
    assert isinstance(head, nn.Linear)
    shape = (head.out_features, head.in_features)
    if rows is None or tuple(rows[0].shape) != shape or tuple(rows[1].shape) != shape[:1]:
        rows = quantize_int8_rows(head.weight.detach())
    qweight, scales = rows
    n, half = shape[0], CHECK_ROWS // 2
    sample = torch.arange(n) if n <= CHECK_ROWS else torch.cat([torch.arange(half + 1), torch.arange(n - half, n)])
    try:
        why = batch_invariant(pack_int8_rows(qweight[sample], scales[sample]))
    except (RuntimeError, NotImplementedError, AttributeError) as exc:  # a torch whose quantized ops changed
        return 0, f"the int8 head could not be packed ({type(exc).__name__}: {str(exc)[:120]})"
    if why is not None:
        return 0, f"the int8 head failed its check on this CPU ({why})"
    new = Int8RowsHead(head.weight, qweight, scales)
    model.lm_head = new
    return new.nbytes, None


def _refusal(head: object) -> str | None:
    if type(head) is not nn.Linear or head.bias is not None:
        return "the head is not a plain dense linear"
    if head.weight.is_cuda or head.weight.device.type != "cpu":
        return "the head is not on the CPU"
    if not available():
        return "this torch has no fbgemm dynamic quantized linear"
    return None
