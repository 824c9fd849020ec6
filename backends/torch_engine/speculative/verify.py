"""Accepting proposals: draw-and-compare for point-mass proposals, the rejection rule for a draft's q (lossless).

One speculative row's logits are (k + 1, vocab): row j is the target's distribution for the token after the
last sampled token and the first j proposals.

Point-mass proposals (prompt lookup; a greedy draft), greedy or sampled: the target's own sampler decides every
position of the row at once (Sampler.sample_ahead: greedy rows take the argmax; sampled rows draw with the
uniform numbers plain decoding would use there, the request's noise counter plus j); proposal j is accepted
while it equals the target's token at j, and the target's token after the accepted ones is emitted too.  Every
emitted token is then the token plain decoding would have produced with the same seed: a token at position j is
kept only when the context it was computed on (the proposals before it) is the one the target itself chose, and
its uniform number depends on nothing the proposal saw.  So the output is the same with and without
speculation, token for token (greedy up to bf16 rounding between a one-row and a (k + 1)-row forward:
tests/greedy_agreement.py's near-tie rule; sampled likewise), and a point-mass proposal x is accepted with
probability p(x), the most any lossless rule can accept it with (the rejection rule's min(1, p(x) / 1)).

Drafted proposals with q (a sampled draft model: Leviathan et al. 2023, Chen et al. 2023): with p_j the
target's filtered distribution (draw.kept_probs: draw.filtered_probs without its vocabulary sort) and q_j the
draft's, proposal x is accepted with probability min(1, p_j(x) / q_j(x)); at the first rejection the token is
drawn from normalize(max(0, p_j - q_j)); when all k are accepted one more is drawn from p_k.  Its uniform numbers
come from draw.uniforms (the sampler's SplitMix64) keyed by the row's key and counted by position (two numbers
per position), so a seeded request gets the same text alone or batched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backends.api import SamplingParams
from backends.torch_engine.draw import draw_index, kept_probs, uniforms


def check_proposal(proposal: Sequence[int], vocab: int) -> None:
    """ValueError for a proposed id outside the vocabulary (a proposer's bug: that row fails, the batch goes on)."""
    bad = [t for t in proposal if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"proposed token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")


def accept_matching(targets: Sequence[int], proposal: Sequence[int]) -> tuple[int, ...]:
    """The proposals that match the target's own tokens, then the target's token after them (1 to k + 1).
    targets: the target's token at each of the row's k + 1 positions."""
    k = len(proposal)
    assert len(targets) == k + 1, f"{len(targets)} target tokens for {k} proposals"
    accepted = 0
    while accepted < k and targets[accepted] == proposal[accepted]:
        accepted += 1
    return (*proposal[:accepted], targets[accepted])


def rejection_row(
    logits: torch.Tensor,
    proposal: Sequence[int],
    params: SamplingParams,
    draft_probs: torch.Tensor,
    key: int,
    position: int,
) -> tuple[int, ...]:
    """The accepted proposals followed by one more token (1 to k + 1 tokens), by the rejection rule.
    logits: (k + 1, vocab) float32; proposal: the k proposed ids; draft_probs: (k, vocab) q_j; key, position:
    the row's noise key and the position of the first token decided."""
    k = len(proposal)
    assert logits.shape[0] == k + 1, f"{logits.shape[0]} logit rows for {k} proposals"
    check_proposal(proposal, logits.shape[-1])
    p = kept_probs(logits, [params] * (k + 1))  # (k + 1, vocab); no vocabulary sort under a top-k
    u = torch.from_numpy(uniforms([key] * (2 * k + 2), range(2 * position, 2 * (position + k + 1))))
    index = torch.tensor(proposal, dtype=torch.long)
    px = p[:k].gather(1, index.unsqueeze(1)).squeeze(1)  # (k,)
    qx = draft_probs[:k].to(p.dtype).gather(1, index.unsqueeze(1)).squeeze(1)
    ratio = torch.where(qx > 0, (px / qx.clamp(min=1e-30)).clamp(max=1.0), torch.ones_like(px))
    rejected = (u[0 : 2 * k : 2] >= ratio).nonzero()
    if rejected.numel() == 0:
        return (*proposal, draw_index(p[k], float(u[2 * k + 1])))
    j = int(rejected[0, 0])
    residual = (p[j] - draft_probs[j].to(p.dtype)).clamp_(min=0.0)
    if float(residual.sum()) <= 0.0:  # p == q on the support (rounding): p itself is the residual's limit
        residual = p[j]
    return (*proposal[:j], draw_index(residual, float(u[2 * j + 1])))
