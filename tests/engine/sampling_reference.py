"""The sampler's rules written row by row, in float64, over a whole sorted vocabulary: the reference the batched
draw (backends/torch_engine/draw.py) is tested against.  Slow and plain on purpose."""

from __future__ import annotations

import math
from collections.abc import Sequence

from backends.api import SamplingParams


def reference_probs(row: Sequence[float], p: SamplingParams) -> list[float]:
    """The distribution one row draws from: top-k, top-p, min-p, then temperature (draw.py's module docstring)."""
    vocab = len(row)
    if p.greedy:
        best = max(range(vocab), key=lambda t: (row[t], -t))
        return [1.0 if t == best else 0.0 for t in range(vocab)]
    m = max(row)
    d = [x - m for x in row]
    e = [math.exp(x) for x in d]
    order = sorted(range(vocab), key=lambda t: (-row[t], t))
    k = p.top_k if 0 < p.top_k < vocab else vocab
    candidates = order[:k]
    mass = sum(e[t] for t in candidates)
    kept: set[int] = set()
    above = 0.0
    i = 0
    while i < len(candidates):  # tie groups: a token is kept when the mass strictly above it is < top_p
        j = i
        while j < len(candidates) and row[candidates[j]] == row[candidates[i]]:
            j += 1
        group = candidates[i:j]
        if p.top_p >= 1 or above < p.top_p * mass:
            kept.update(group)
        above += sum(e[t] for t in group)
        i = j
    if p.min_p > 0:
        kept = {t for t in kept if d[t] >= math.log(p.min_p)}
    kept.add(order[0])
    q = [math.exp(d[t] / p.temperature) if t in kept else 0.0 for t in range(vocab)]
    total = sum(q)
    return [x / total for x in q]


def reference_token(row: Sequence[float], p: SamplingParams, u: float) -> int:
    """The first token, in vocabulary order, whose cumulative probability exceeds u."""
    probs = reference_probs(row, p)
    running = 0.0
    last = max(t for t, x in enumerate(probs) if x > 0)
    for t, x in enumerate(probs):
        running += x
        if x > 0 and running > u:
            return t
    return last
