"""The sampler's grammar-mask step: constrained rows get -inf on every token their grammar forbids.

A step of its own, before penalties and filters (backends/torch_engine/sampler.py calls it first), so top-k,
top-p and min-p choose among allowed tokens only.  Rows without a matcher pay nothing: with no constrained row
in the batch this is one `any()` over the batch.  Each constrained row's bitmask is computed by its matcher
(llguidance, microseconds) into one (rows, words) int32 host buffer, unpacked to booleans with numpy and
applied with one torch.where on the logits' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def apply_grammar_masks(logits: torch.Tensor, matchers: Sequence[Any] | None) -> torch.Tensor:
    """logits: (rows, vocab) float32.  Returns logits with forbidden tokens at -inf in constrained rows (a new
    tensor when any row is constrained; `logits` itself otherwise, and the runner's tensor is never written:
    log-probabilities are of the unmasked logits)."""
    if not matchers:
        return logits
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    num_words = matchers[rows[0]].num_words
    bitmask = np.zeros((len(rows), num_words), dtype=np.int32)  # (constrained rows, words), host memory
    for j, i in enumerate(rows):
        matchers[i].fill_bitmask(bitmask[j].ctypes.data, num_words * 4)
    if not bitmask.any(axis=1).all():  # a row with nothing allowed would sample NaN: fail it (the sampler
        raise ValueError("the constraint allows no next token")  # retries rows alone, so only that row fails)
    # (constrained rows, vocab) bool, on the logits' device (one host-to-device copy of it on CUDA)
    allowed = unpack_bitmask(bitmask, logits.shape[-1]).to(logits.device)
    # torch.where over the constrained rows: measured ~3x faster here than masked_fill with the inverted mask
    minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    if len(rows) == logits.shape[0]:
        return torch.where(allowed, logits, minus_inf)
    out = logits.clone()
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out[index] = torch.where(allowed, logits[index], minus_inf)
    return out


def unpack_bitmask(bitmask: np.ndarray, vocab: int) -> torch.Tensor:
    """(rows, words) int32 -> (rows, vocab) bool; bit b of word w is token 32 w + b (little-endian, so numpy's
    unpackbits reads the bytes in order: ~100x faster than shifting int32 words in torch); ids past the
    bitmask's 32 x words (a padded embedding) are forbidden."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    if bits.shape[1] < vocab:
        bits = np.pad(bits, ((0, 0), (0, vocab - bits.shape[1])))
    return torch.from_numpy(bits[:, :vocab].astype(bool))
