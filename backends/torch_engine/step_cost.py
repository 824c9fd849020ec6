"""What a step costs, learned from the steps that ran (pure Python, no torch): the scheduler's TTFT plan asks it.

Model: seconds(step) = base_s + per_token_s x num_tokens.  The base is what every step pays whatever its size
(reading the weights once on a CPU, launches, sampling, Python); the per-token part is the prefill and decode
compute.  Both are fitted by least squares over the recent steps, each step's weight decaying by `decay` per
newer step, so the fit follows the machine as its load changes (another process taking a core doubles both).
Attention's growth with context length is not modelled: at the lengths a TTFT target matters for (a chat
prompt of a few hundred tokens) it is a few percent of a step here; the decay absorbs a slow drift.

Until `min_steps` steps were seen (and while the sizes seen do not yet tell base from slope) the model knows
nothing and says so (None): the scheduler then plans nothing and runs its plain budget.
"""

from __future__ import annotations

import math


class StepCostModel:
    def __init__(self, decay: float = 0.97, min_steps: int = 4) -> None:
        assert 0 < decay < 1 and min_steps >= 1
        self.decay = decay
        self.min_steps = min_steps
        self.num_steps = 0
        self._skipped_first = False
        # decayed sums of 1, n, n^2, t, n t over the observed steps
        self._w = self._n = self._nn = self._t = self._nt = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Record one step that ran `num_tokens` tokens in `seconds` (the engine's whole step)."""
        if not self._skipped_first:  # the first step pays one-time costs (allocation, kernel selection, warm-up)
            self._skipped_first = True
            return
        if num_tokens <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        d = self.decay
        n, t = float(num_tokens), float(seconds)
        self._w = self._w * d + 1.0
        self._n = self._n * d + n
        self._nn = self._nn * d + n * n
        self._t = self._t * d + t
        self._nt = self._nt * d + n * t
        self.num_steps += 1

    def coefficients(self) -> tuple[float, float] | None:
        """(base_s, per_token_s), or None while too few steps were seen."""
        if self.num_steps < self.min_steps or self._w <= 0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n <= max(1.0, 1e-6 * mean_n * mean_n):
            # every step had about the same size: base and slope cannot be told apart; charge it all per token
            # (pessimistic for small steps, which errs towards planning smaller steps)
            return 0.0, mean_t / mean_n
        slope = (self._nt / self._w - mean_n * mean_t) / var_n
        slope = max(slope, 1e-7)  # time never falls with more tokens; noise can say it does
        base = max(mean_t - slope * mean_n, 0.0)
        return base, slope

    def estimate(self, num_tokens: int) -> float | None:
        """Seconds a step of `num_tokens` tokens is expected to take; None = unknown yet."""
        c = self.coefficients()
        return None if c is None else c[0] + c[1] * num_tokens

    def max_tokens_within(self, seconds: float) -> int | None:
        """The most tokens one step can run in `seconds` (0 when even an empty step takes longer); None =
        unknown yet."""
        c = self.coefficients()
        if c is None:
            return None
        base, slope = c
        return max(int((seconds - base) / slope + 1e-6), 0)  # 1e-6: a float just under a whole token count
