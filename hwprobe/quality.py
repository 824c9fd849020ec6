"""Quality-loss rules shared by `hearth ppl --compare` and the planner (pure stdlib: hwprobe imports no app)."""

from __future__ import annotations

# Perplexity increase above which generation quality may suffer noticeably: an absolute 2 points, or 5% of the
# base perplexity, whichever is hit first.
DELTA_PPL_ABS_LIMIT = 2.0
DELTA_PPL_REL_LIMIT = 0.05


def delta_ppl_warning(base_ppl: float, other_ppl: float) -> str | None:
    """A one-line warning when `other_ppl` is worse than `base_ppl` by more than 2 or by more than 5% of the
    base; None when the loss is within both limits."""
    delta = other_ppl - base_ppl
    if delta > DELTA_PPL_ABS_LIMIT or delta > DELTA_PPL_REL_LIMIT * base_ppl:
        return (
            f"perplexity rises by {delta:.3f} ({100 * delta / base_ppl:.1f}% of {base_ppl:.3f}): "
            f"above the limit of {DELTA_PPL_ABS_LIMIT:g} or {100 * DELTA_PPL_REL_LIMIT:g}%, "
            "generation quality may suffer noticeably"
        )
    return None
