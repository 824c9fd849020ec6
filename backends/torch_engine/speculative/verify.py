"""Accepting proposals: greedy agreement, or the standard rejection-sampling rule (lossless).

One speculative row's logits are (k + 1, vocab): row j is the target's distribution for the token after the
last sampled token and the first j proposals.

Greedy rows (temperature 0): proposal j is accepted while it is the argmax of row j; the token after the
accepted ones is the argmax of the next row.  That is exactly what plain decoding would produce (up to bf16
rounding between a one-row and a (k + 1)-row forward: tests/greedy_agreement.py's near-tie rule).

Sampled rows (Leviathan et al. 2023, Chen et al. 2023): with p_j the target's filtered distribution (the
sampler's own top-k / top-p / min-p / temperature, sampler.filtered_probs) and q_j the proposer's, proposal x is
accepted with probability min(1, p_j(x) / q_j(x)); at the first rejection the token is drawn from
normalize(max(0, p_j - q_j)); when all k are accepted one more is drawn from p_k.  Every emitted token is then
distributed as the target alone would draw it.  Prompt lookup proposes a point mass (q_j(x) = 1): accept with
probability p_j(x), and on rejection draw from p_j with x removed.

Reproducibility: a sampled row's uniforms come from SplitMix64 keyed by the request's noise key and counted by
the position being decided (two numbers per position), so a seeded request gets the same text alone or batched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backends.api import SamplingParams
from backends.torch_engine.sampler import filtered_probs

_M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def uniform(key: int, counter: int) -> float:
    """A number in [0, 1) that depends only on (key, counter)."""
    return (_splitmix64(key ^ _splitmix64(counter)) >> 11) * (1.0 / (1 << 53))


def verify_row(
    logits: torch.Tensor,
    proposal: Sequence[int],
    params: SamplingParams,
    draft_probs: torch.Tensor | None = None,
    key: int = 0,
    position: int = 0,
) -> tuple[int, ...]:
    """The accepted proposals followed by one more token (1 to k + 1 tokens).
    logits: (k + 1, vocab) float32; proposal: the k proposed ids; draft_probs: (k, vocab) q_j, or None (a point
    mass); key, position: the row's noise key and the position of the first token decided (sampled rows)."""
    k = len(proposal)
    assert logits.shape[0] == k + 1, f"{logits.shape[0]} logit rows for {k} proposals"
    if params.greedy:
        best = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < k and best[accepted] == proposal[accepted]:
            accepted += 1
        return (*proposal[:accepted], best[accepted])
    p = filtered_probs(logits.float(), [params] * (k + 1))  # (k + 1, vocab)
    for j, x in enumerate(proposal):
        pos = position + j
        if draft_probs is None:
            ratio = float(p[j, x])
        else:
            qx = float(draft_probs[j, x])
            ratio = 1.0 if qx <= 0.0 else min(1.0, float(p[j, x]) / qx)
        if uniform(key, 2 * pos) < ratio:
            continue
        if draft_probs is None:
            residual = p[j].clone()
            residual[x] = 0.0
        else:
            residual = (p[j] - draft_probs[j].to(p.dtype)).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q on the support (rounding): p itself is the residual's limit
            residual = p[j]
        return (*proposal[:j], _draw(residual, uniform(key, 2 * pos + 1)))
    return (*proposal, _draw(p[k], uniform(key, 2 * (position + k) + 1)))


def _draw(weights: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from unnormalised non-negative weights (vocab,)."""
    cdf = weights.double().cumsum(dim=0)
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True)[0])
    index = min(index, weights.shape[0] - 1)
    if float(weights[index]) <= 0.0:  # rounding at the very end of the cdf
        index = int(weights.argmax())
    return index
