"""The sampled rows' draw: top-k, top-p, min-p and temperature for every row of a step in a few batched tensor
ops, and the counter-based noise that makes a seeded request's tokens independent of its batch.

What a row keeps, from its own logits only (after penalties and grammar masks; m = the row's largest logit,
d = logit - m, so the best token has d = 0):
- top-k (0 < top_k < vocab): the k largest logits (torch.topk's choice among tokens tied at the k-th place);
- top-p (< 1): every token whose strictly larger tokens hold less than top_p of the mass, the mass being exp(d)
  over the top-k candidates (over the whole vocabulary without top-k): the smallest set of most likely tokens
  that reaches top_p, plus the tokens tied with its last one;
- min-p (> 0): d >= log(min_p), i.e. a probability at least min_p x the best token's;
- the best token, always.
Then temperature: q = exp(d / T) on the kept tokens (0 elsewhere), and the draw is the first token, in
vocabulary order, whose cumulative q exceeds u x sum(q), with u the row's uniform number.  tests/engine/
sampling_reference.py is this paragraph row by row over a whole sorted vocabulary; the batched paths below are
tested against it.

Three paths, chosen per row by its parameters, never by the batch (a loop over at most a few groups of rows,
never over rows):
- "vocab" (top-k and top-p off: OpenAI's defaults, so most server traffic): no sort at all; d, the min-p mask,
  exp and one cumulative sum over the vocabulary, in a reused scratch buffer (a fresh 3 MiB tensor per step
  costs more in page faults than the arithmetic).
- "top-k" (rows grouped by their k): one torch.topk(k) for the group, then the filters on (rows, k).
- "top-p without top-k": the row's mass over the vocabulary (one exp and cumulative sum), then its top-K
  candidates with K = 64, 512, 4096 until the nucleus ends inside them (or min-p cuts before), each row leaving
  as soon as its own candidates suffice, else the whole sorted vocabulary: a peaked distribution costs one
  small topk, a flat one a full sort, as every such row did before.

Why a row's draw does not depend on the other rows: every op is row-wise; cumulative sums on the CPU are a
serial scan per row in float64 (so a row's sums over its candidates equal its sums over the whole vocabulary
with zeros in between, bit for bit), the kept sets come from comparisons, and the list paths' widths depend on
the row alone.  The one op whose bits could in principle depend on a row's place in the batch is exp (a
vectorised body and a scalar tail); with vocabularies that are multiples of 64 (all we run) no row straddles a
tail.

Noise: SplitMix64 is counter-based: its n-th output is mix(key + n x gamma), with no state to carry.  A request's
key comes from its seed (or from the engine's seeded random source), the counter is the number of tokens it has
drawn, so its n-th token sees the same u alone, in a batch of 16, after a preemption, or when a failed batch is
retried row by row.  Computed for all rows at once with numpy's wrapping uint64 arithmetic (~10 us for 16 rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from backends.api import SamplingParams

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# top-p without top-k: the candidates' widths tried in turn while a row's nucleus is wider; past the last, the
# whole vocabulary is sorted (a topk that wide is slower than the sort: 16 x 49152, 1 thread: topk(4096) 10 ms,
# sort 85 ms, topk(32768) slower still)
CANDIDATE_WIDTHS = (64, 512, 4096)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def noise_key(seed_u64: int) -> int:
    """A request's noise key from its 64-bit seed: mixed, so that nearby seeds (n choices use seed, seed + 1, ...)
    start far apart in the generator's sequence."""
    return int(_mix64(np.array([seed_u64], dtype=np.uint64))[0])


def uniforms(keys: Sequence[int], counters: Sequence[int]) -> np.ndarray:
    """(rows,) float32 in [0, 1): row i's counters[i]-th number of the SplitMix64 stream keyed by keys[i], with 24
    random bits (every float32 in [0, 1) with that spacing is exact)."""
    k = np.array(keys, dtype=np.uint64)
    n = np.array(counters, dtype=np.uint64) + np.uint64(1)
    z = _mix64(k + n * _GAMMA)
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


class Scratch:
    """Reused (rows, vocab) float32 buffers for the vocabulary-wide steps, one per name."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.device != like.device or buf.numel() < like.numel():
            buf = self._buffers[name] = torch.empty(like.numel(), dtype=torch.float32, device=like.device)
        return buf[: like.numel()].view(like.shape)


def _columns(values: Sequence[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)  # (rows, 1)


def _log_min_p(params: Sequence[SamplingParams]) -> list[float]:
    return [math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params]


def effective_top_k(params: SamplingParams, vocab: int) -> int:
    """top_k as the draw uses it: 0 (off) when it is 0 or keeps the whole vocabulary."""
    return params.top_k if 0 < params.top_k < vocab else 0


def draw(logits: torch.Tensor, params: Sequence[SamplingParams], u: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """One token per row: logits (rows, vocab) float32 after penalties and masks, u (rows,) uniforms on the
    logits' device.  Returns (rows,) int64."""
    rows, vocab = logits.shape
    groups: dict[tuple[str, int], list[int]] = {}
    for i, p in enumerate(params):
        k = effective_top_k(p, vocab)
        groups.setdefault(("top_k", k) if k else ("top_p", 0) if p.top_p < 1 else ("vocab", 0), []).append(i)
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    for (kind, k), index in groups.items():
        whole = len(index) == rows
        sub = logits if whole else logits[index]
        ps = params if whole else [params[i] for i in index]
        su = (u if whole else u[index]).unsqueeze(1)  # (r, 1)
        if kind == "vocab":
            tokens = _draw_vocab(sub, ps, su, scratch)
        elif kind == "top_k":
            values, ids = sub.topk(k, dim=-1)
            tokens = _draw_candidates(values, ids, None, ps, su)
        else:
            tokens = _draw_nucleus(sub, ps, su, scratch)
        if whole:
            return tokens
        out[index] = tokens
    return out


def _draw_vocab(
    logits: torch.Tensor, params: Sequence[SamplingParams], u: torch.Tensor, scratch: Scratch
) -> torch.Tensor:
    """Rows without top-k or top-p: min-p and temperature over the whole vocabulary, in vocabulary order."""
    device = logits.device
    m = logits.amax(dim=-1, keepdim=True)
    q = torch.sub(logits, m, out=scratch.get("q", logits))  # d
    log_min_p = _log_min_p(params)
    if any(x > -math.inf for x in log_min_p):
        q.masked_fill_(q < _columns(log_min_p, device), -math.inf)
    q.div_(_columns([p.temperature for p in params], device)).exp_()
    cdf = q.cumsum_(dim=-1)  # in place: the serial scan reads each element before writing it
    return search_cdf(cdf, u)


def search_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw, the one every sampled token goes through (the sampler's rows, the speculative
    verifier's residual and the draft's proposals): the first index whose cumulative value exceeds u x total;
    cdf (r, n) non-decreasing, u (r, 1).  The target stays below the total, so the index is always a token with
    q > 0 (its cumulative value rose there)."""
    total = cdf[:, -1:]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.contiguous(), right=True).squeeze(1)


def draw_index(weights: torch.Tensor, u: float) -> int:
    """search_cdf for one row of unnormalised non-negative weights (n,), summed in float64; all-zero weights (a
    residual that rounding emptied) give the largest weight's index instead of one past the end."""
    cdf = weights.double().cumsum(dim=0)
    if not float(cdf[-1]) > 0.0:
        return int(weights.argmax())
    return int(search_cdf(cdf.unsqueeze(0), torch.tensor([[u]], dtype=torch.float64))[0])


def _draw_candidates(
    values: torch.Tensor,
    ids: torch.Tensor,
    mass: torch.Tensor | None,
    params: Sequence[SamplingParams],
    u: torch.Tensor,
) -> torch.Tensor:
    """values, ids: (r, K) each row's best K tokens, values descending; mass: (r, 1) each row's exp(d) summed
    over the whole vocabulary (top-p without top-k), or None: the candidates' own sum (top-k)."""
    keep, d = candidate_mask(values, mass, params)
    q = _tempered(keep, d, params)
    order = ids.argsort(dim=-1)  # vocabulary order: cumulative sums then equal the whole-vocabulary ones
    cdf = q.gather(1, order).cumsum_(dim=-1)
    return ids.gather(1, order).gather(1, search_cdf(cdf, u).unsqueeze(1)).squeeze(1)


def _tempered(keep: torch.Tensor, d: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """exp(d / T) per row on the kept tokens, 0 elsewhere: a row's unnormalised sampling weights."""
    return torch.where(keep, (d / _columns([p.temperature for p in params], d.device)).exp(), 0.0)


def candidate_mask(
    values: torch.Tensor, mass: torch.Tensor | None, params: Sequence[SamplingParams]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep, d) for sorted candidates: keep (r, K) bool by top-p, min-p and the best token; d = values - max."""
    device = values.device
    d = values - values[:, :1]
    e = d.exp()
    c = e.cumsum(dim=-1)
    total = c[:, -1:] if mass is None else mass
    # mass strictly above each token: the running sum before the first token of its tie group
    before = torch.cat([torch.zeros_like(c[:, :1]), c[:, :-1]], dim=1)
    neg = values.neg()  # ascending, as searchsorted wants
    above = before.gather(1, torch.searchsorted(neg, neg, right=False))
    top_p = _columns([p.top_p for p in params], device)
    keep = (above < top_p * total) | (top_p >= 1)
    keep &= d >= _columns(_log_min_p(params), device)
    keep[:, 0] = True
    return keep, d


def row_mass(logits: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """(r, 1): sum of exp(logit - max) over the whole vocabulary, as the last value of a serial cumulative sum
    (a reduction would split a lone row across threads and round differently than in a batch)."""
    e = torch.sub(logits, logits.amax(dim=-1, keepdim=True), out=scratch.get("mass", logits)).exp_()
    return e.cumsum_(dim=-1)[:, -1:].clone()


def _draw_nucleus(
    logits: torch.Tensor, params: Sequence[SamplingParams], u: torch.Tensor, scratch: Scratch
) -> torch.Tensor:
    """Top-p without top-k: grow each row's candidates until its nucleus (and min-p) ends inside them."""
    vocab = logits.shape[-1]
    mass = row_mass(logits, scratch)
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    pending = list(range(logits.shape[0]))
    widths = [w for w in CANDIDATE_WIDTHS if w < vocab] + [vocab]
    for width in widths:
        rows = logits if len(pending) == logits.shape[0] else logits[pending]
        ps = [params[i] for i in pending]
        values, ids = rows.topk(width, dim=-1) if width < vocab else rows.sort(dim=-1, descending=True)
        keep, _ = candidate_mask(values, mass[pending], ps)
        # complete when the last candidate (hence its tie group and everything below it) is not kept
        done = ~keep[:, -1] if width < vocab else torch.ones_like(keep[:, -1])
        finished = [i for i, ok in zip(pending, done.tolist()) if ok]
        if finished:
            at = [j for j, ok in enumerate(done.tolist()) if ok]
            out[finished] = _draw_candidates(
                values[at], ids[at], mass[finished], [params[i] for i in finished], u[finished]
            )
        pending = [i for i, ok in zip(pending, done.tolist()) if not ok]
        if not pending:
            break
    return out


def filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The whole-vocabulary distribution each row draws from, (rows, vocab) float32 summing to 1 per row.
    For tests and inspection: it sorts every row (slow on large vocabularies)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    values, ids = logits.sort(dim=-1, descending=True, stable=True)
    tops = [effective_top_k(p, vocab) or vocab for p in params]
    rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
    in_top_k = rank < torch.tensor(tops, device=logits.device).unsqueeze(1)
    e = (values - values[:, :1]).exp()
    mass = torch.where(in_top_k, e, 0.0).sum(dim=-1, keepdim=True)
    keep, d = candidate_mask(values.masked_fill(~in_top_k, -math.inf), mass, params)
    keep &= in_top_k
    q = _tempered(keep, d, params)
    q = q / q.sum(dim=-1, keepdim=True)
    return torch.zeros_like(logits).scatter_(1, ids, q)


def kept_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """filtered_probs(logits, params) without sorting the vocabulary of rows with a top-k (the default, 40): their
    distribution lives on their top-k candidates (one torch.topk, then the filters on (rows, k), as the draw
    does), scattered into zeros.  Rows without a top-k take filtered_probs.  For the speculative paths that need
    whole distributions per row (a sampled draft's q, the target's p in the rejection rule): on the 2-core Xeon,
    5 rows of the starter's 49152 logits took 32.5 ms sorted and 0.8 ms through topk(40).  Equal to filtered_probs up
    to float rounding, except where tokens tie at the k-th place (torch.topk's choice, as in the draw)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    out = torch.zeros_like(logits)
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(effective_top_k(p, vocab), []).append(i)
    for k, index in groups.items():
        sub = logits[index]
        ps = [params[i] for i in index]
        if k == 0:
            out[index] = filtered_probs(sub, ps)
            continue
        values, ids = sub.topk(k, dim=-1)
        keep, d = candidate_mask(values, None, ps)
        q = _tempered(keep, d, ps)
        out[index] = torch.zeros_like(sub).scatter_(1, ids, q / q.sum(dim=-1, keepdim=True))
    return out
