"""Perplexity of a model on a token sequence through Backend.logits(), with strided windows, and the mean KL
divergence between two models' next-token distributions at the same scored positions.

Windows: window k covers tokens [k*stride, min(k*stride + ctx, n)); inside it, every token after the window's
first that no earlier window scored is scored (predicted from the logits of the position before it).  So
stride == ctx gives consecutive windows that each score all but their first token, and stride < ctx gives each
scored token up to ctx - stride tokens of extra left context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.errors import InvalidRequestError

if TYPE_CHECKING:
    import numpy as np

    from backends.api import Backend


@dataclass(frozen=True)
class Window:
    start: int  # first token of the window (absolute position)
    end: int  # one past the last token of the window
    first_scored: int  # first absolute position scored in this window; scored positions are [first_scored, end)


@dataclass
class PplResult:
    perplexity: float  # exp(mean negative log-likelihood over the scored tokens)
    tokens_scored: int  # how many tokens were scored
    ctx: int  # window length in tokens
    stride: int  # window step in tokens
    nll_sum: float  # total negative log-likelihood in nats
    kl_mean: float | None = None  # compare only: mean KL(base || other) in nats over the scored positions


def plan_windows(n_tokens: int, ctx: int, stride: int) -> list[Window]:
    """The windows that score every token but the first exactly once (see the module docstring)."""
    if ctx < 2:
        raise InvalidRequestError(f"--ctx must be at least 2 tokens, got {ctx}", "use e.g. --ctx 512")
    if not 1 <= stride <= ctx:
        raise InvalidRequestError(
            f"--stride must be between 1 and --ctx ({ctx}), got {stride}",
            "a stride larger than the window would leave tokens unscored",
        )
    if n_tokens < 2:
        raise InvalidRequestError(
            f"the text has {n_tokens} token(s); perplexity needs at least 2", "use a longer text file"
        )
    out: list[Window] = []
    scored_upto = 1  # positions below this are scored already (position 0 never is: nothing predicts it)
    start = 0
    while True:
        end = min(start + ctx, n_tokens)
        first = max(scored_upto, start + 1)
        if first < end:
            out.append(Window(start, end, first))
            scored_upto = end
        if end >= n_tokens:
            return out
        start += stride


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64. (rows, vocab) -> (rows, vocab)."""
    import numpy as np  # lazy: heavy: numpy

    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def window_logprobs(backend: Backend, token_ids: Sequence[int], w: Window) -> np.ndarray:
    """Log-probabilities of the distributions that predict positions [w.first_scored, w.end). (scored, vocab)"""
    logits = backend.logits(token_ids[w.start : w.end])  # (w.end - w.start, vocab); row i predicts token start+i+1
    rows = logits[w.first_scored - 1 - w.start : w.end - 1 - w.start]
    return log_softmax(rows)


def perplexity(
    backend: Backend,
    token_ids: Sequence[int],
    ctx: int,
    stride: int,
    other: Backend | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[PplResult, PplResult | None]:
    """Perplexity of `backend` (and of `other` on the same windows, with the mean KL(backend || other))."""
    import numpy as np  # lazy: heavy: numpy

    windows = plan_windows(len(token_ids), ctx, stride)
    nll = [0.0, 0.0]
    kl_sum = 0.0
    scored = 0
    for i, w in enumerate(windows):
        targets = np.asarray(token_ids[w.first_scored : w.end], dtype=np.int64)
        lp = window_logprobs(backend, token_ids, w)
        nll[0] -= float(lp[np.arange(len(targets)), targets].sum())
        if other is not None:
            lq = window_logprobs(other, token_ids, w)
            if lq.shape != lp.shape:
                raise InvalidRequestError(
                    f"the two models have different vocabularies ({lp.shape[1]} vs {lq.shape[1]} tokens)",
                    "compare quants of the same model",
                )
            nll[1] -= float(lq[np.arange(len(targets)), targets].sum())
            kl_sum += float((np.exp(lp) * (lp - lq)).sum())
        scored += len(targets)
        if progress:
            progress(i + 1, len(windows))
    base = PplResult(math.exp(nll[0] / scored), scored, ctx, stride, nll[0])
    if other is None:
        return base, None
    base.kl_mean = kl_sum / scored
    return base, PplResult(math.exp(nll[1] / scored), scored, ctx, stride, nll[1], kl_sum / scored)
