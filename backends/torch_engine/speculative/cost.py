"""When speculation pays: a step's measured cost by its token count, and the k a row should propose (pure Python).

A verification row of k + 1 tokens is not free, and what it costs depends on the machine: on the 2-core EPYC a
4-token row cost ~1.1-1.4x a one-token decode on the starter and a 6-9 token row 2-3x (the int4 kernel's cost
jumps past 4 rows; scripts/bench_verify_rows.py), and a GPU's curve is flatter.  So the engine measures it: every
step without a prompt chunk is timed (StepCosts.observe, by its total tokens), and a row proposes the k with the
best expected tokens per unit of step time, and only when that beats a plain decode.

The expected tokens of a row with k proposals, each accepted with probability a given the ones before it (the
request's recent acceptance, SpecState.acceptance): 1 + a + a^2 + ... + a^k (the accepted proposals, and always
one token of the target's own).  The gain is that over the step's cost with the k extra tokens relative to its
cost without them.  A size never measured is priced optimistically (the largest measured size below it plus
UNMEASURED_SLOPE per token), so it gets tried once and measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

UNMEASURED_SLOPE = 0.05  # relative cost per extra token assumed for step sizes not yet measured
SMOOTHING = 0.2  # weight of a new timing in a size's moving average


@dataclass
class StepCosts:
    """Seconds of a step without prompt chunks, by its total tokens (a moving average per size)."""

    seconds: dict[int, float] = field(default_factory=dict)

    def observe(self, num_tokens: int, seconds: float) -> None:
        old = self.seconds.get(num_tokens)
        self.seconds[num_tokens] = seconds if old is None else old + SMOOTHING * (seconds - old)

    def cost(self, num_tokens: int) -> float | None:
        """The step's seconds with num_tokens tokens: measured, else estimated from the largest measured size
        below it; None when no size at or below it was measured."""
        if num_tokens in self.seconds:
            return self.seconds[num_tokens]
        below = [n for n in self.seconds if n < num_tokens]
        if not below:
            return None
        n = max(below)
        return self.seconds[n] * (1.0 + UNMEASURED_SLOPE * (num_tokens - n))

    def ratio(self, base: int, extra: int) -> float:
        """cost(base + extra) / cost(base): what adding `extra` tokens to a step of `base` tokens costs."""
        lo, hi = self.cost(base), self.cost(base + extra)
        if lo is None or hi is None or lo <= 0.0:
            return 1.0 + UNMEASURED_SLOPE * extra
        return max(hi / lo, 1.0)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a row with k proposals emits on average: 1 + a + ... + a^k."""
    return sum(acceptance**i for i in range(k + 1))


def best_k(acceptance: float, k_cap: int, costs: StepCosts, base: int) -> tuple[int, float]:
    """(k, gain): the k in 1..k_cap with the most expected tokens per unit of step time, and that gain over a
    plain decode (> 1: speculating pays)."""
    best, gain = 0, 1.0
    for k in range(1, k_cap + 1):
        g = expected_tokens(acceptance, k) / costs.ratio(base, k)
        if g > gain:
            best, gain = k, g
    return best, gain
