"""The sampler's grammar-mask step: constrained rows get -inf on every token their grammar forbids.

A step of its own, before penalties and filters (backends/torch_engine/sampler.py calls it first), so top-k,
top-p and min-p choose among allowed tokens only.  Rows without a matcher pay nothing: with no constrained row
in the batch this is one `any()` over the batch.  Each constrained row's bitmask is computed by its matcher
(llguidance, tens of microseconds) into one (rows, words) int32 buffer, unpacked to booleans in one op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def apply_grammar_masks(logits: torch.Tensor, matchers: Sequence[Any] | None) -> torch.Tensor:
    """logits: (rows, vocab) float32.  Returns logits with forbidden tokens at -inf in constrained rows (a new
    tensor when any row is constrained; `logits` itself otherwise)."""
    if not matchers:
        return logits
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    num_words = matchers[rows[0]].num_words
    bitmask = torch.zeros((len(rows), num_words), dtype=torch.int32)  # (constrained rows, words)
    for j, i in enumerate(rows):
        row = bitmask[j]
        matchers[i].fill_bitmask(row.data_ptr(), row.numel() * 4)
    allowed = unpack_bitmask(bitmask, logits.shape[-1])  # (constrained rows, vocab) bool
    if not bool(allowed.any(dim=1).all()):  # a row with nothing allowed would sample NaN: fail it (the sampler
        raise ValueError("the constraint allows no next token")  # retries rows alone, so only that row fails)
    logits = logits.clone()  # the runner's tensor stays raw (log-probabilities are of the unmasked logits)
    forbidden = ~allowed
    for j, i in enumerate(rows):  # in place, row by row: no gather/scatter copies of the batch
        logits[i].masked_fill_(forbidden[j], float("-inf"))
    return logits


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(rows, words) int32 -> (rows, vocab) bool; bit b of word w is token 32 w + b; ids past the bitmask's
    32 x words (a padded embedding) are forbidden."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)  # (rows, 32 words)
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    pad = torch.zeros((bits.shape[0], vocab - bits.shape[1]), dtype=torch.bool)
    return torch.cat([bits, pad], dim=1)
