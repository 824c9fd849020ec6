"""Batched next-token sampling with per-request generators.

A constrained row (structured output) gets its grammar mask (backends/torch_engine/grammar_mask.py): every
token its grammar forbids is -inf before the filters look at the logits.

Order of the steps follows llama.cpp's chain (what the llama.cpp backend does with the same SamplingParams):
logit_bias and OpenAI's presence/frequency penalties (backends.torch_engine.penalties; the llama.cpp backend
applies the same two in its logits processor, first in its chain) -> repetition penalty -> top-k -> top-p ->
min-p (on the un-tempered distribution) -> temperature -> draw.  Greedy rows (temperature 0) are one argmax for
the whole batch, taken after the same logit steps.

Reproducibility: each request owns a `torch.Generator` seeded from `SamplingParams.seed` (or from the
sampler's own seeded source when None), and draws exactly one uniform number from it per sampled token.  Every
other operation is row-wise, so a request's tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from backends.api import SamplingParams, seed_u64
from backends.torch_engine.grammar_mask import apply_grammar_masks
from backends.torch_engine.penalties import apply_bias_and_openai_penalties, has_openai_adjustments

REPEAT_LAST_N = 64  # tokens looked back at by the repetition penalty (llama.cpp's penalty_last_n default)


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._seed_source = random.Random(seed)  # seeds for requests that bring none

    def prepare(self, request_id: str, params: SamplingParams) -> None:
        """Set up a request's generator when it is added, so a seed the generator refuses fails that request
        before it runs, not a batch.  Greedy requests draw nothing and get none."""
        if not params.greedy:
            self._generator(request_id, params)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        g = self._generators.get(request_id)
        if g is None:
            g = torch.Generator(device="cpu")
            # SamplingParams took any 64-bit seed, signed or unsigned; manual_seed takes [0, 2**64) unchanged
            g.manual_seed(seed_u64(params.seed) if params.seed is not None else self._seed_source.randrange(2**63))
            self._generators[request_id] = g
        return g

    def sample(
        self,
        logits: torch.Tensor,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        num_prompt_tokens: Sequence[int] | None = None,
        matchers: Sequence[Any] | None = None,
    ) -> list[int | Exception]:
        """One token per row, or the exception that row raised: one request's failure is that request's alone.
        logits: (num_rows, vocab); histories: each row's tokens so far (prompt and output), for the repetition
        penalty; num_prompt_tokens: how many of them are the prompt (OpenAI's presence/frequency penalties count
        only the rest, the generated tokens); None = 0 each; matchers: each row's grammar state
        (backends.constrained.Matcher) or None (unconstrained).  Matchers are only read here (their mask); the
        engine advances them with the tokens returned.

        The batch is sampled in one go; if that raises, every generator is put back as it was and the rows are
        sampled one by one, so the rows that can be sampled get the token they would have got in the batch
        (every operation is row-wise, see the module docstring) and each failing row gets its own error."""
        assert logits.dim() == 2 and logits.shape[0] == len(request_ids) == len(params) == len(histories)
        # ~11 us for 16 seeded rows (Zen 4), against ~18 ms to sample them over a 49152-token vocabulary
        states = {rid: self._generators[rid].get_state() for rid in request_ids if rid in self._generators}
        # the generated tokens, for the rows whose penalties count them (the others skip the copy)
        outputs = [
            h[n:] if has_openai_adjustments(p) else ()
            for h, n, p in zip(histories, num_prompt_tokens or [0] * len(histories), params)
        ]
        try:
            return list(self._sample_rows(logits, request_ids, params, histories, outputs, matchers))
        except Exception:  # noqa: BLE001 - find the rows that fail, below
            pass
        for rid in request_ids:  # undo the draws of the failed attempt
            if rid in states:
                self._generators[rid].set_state(states[rid])
            else:
                self._generators.pop(rid, None)
        out: list[int | Exception] = []
        for i in range(len(request_ids)):
            try:
                out.extend(
                    self._sample_rows(
                        logits[i : i + 1],
                        request_ids[i : i + 1],
                        params[i : i + 1],
                        histories[i : i + 1],
                        outputs[i : i + 1],
                        matchers[i : i + 1] if matchers else None,
                    )
                )
            except Exception as exc:  # noqa: BLE001 - that request's error, reported on its stream
                out.append(exc)
        return out

    def _sample_rows(
        self,
        logits: torch.Tensor,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        outputs: Sequence[Sequence[int]],
        matchers: Sequence[Any] | None = None,
    ) -> list[int]:
        logits = apply_bias_and_openai_penalties(logits.float(), params, outputs)
        logits = apply_grammar_masks(logits, matchers)  # last: no bias brings a forbidden token back
        tokens = torch.empty(logits.shape[0], dtype=torch.long)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if greedy:
            rows = logits if len(greedy) == logits.shape[0] else logits[greedy]
            tokens[greedy] = _apply_penalties(rows, [params[i] for i in greedy], [histories[i] for i in greedy]).argmax(
                dim=-1
            )
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            # Rows are grouped by their candidate count so that a row's softmax and cumsum always run over
            # the same length, whatever else is in the batch (a longer padded row could round differently).
            vocab = logits.shape[-1]
            groups: dict[int, list[int]] = {}
            for i in sampled:
                groups.setdefault(params[i].top_k if 0 < params[i].top_k < vocab else vocab, []).append(i)
            for group in groups.values():
                ps = [params[i] for i in group]
                rows = _apply_penalties(logits[group], ps, [histories[i] for i in group])
                values, order = candidates(rows, ps)  # (len(group), k)
                probs = filtered_sorted_probs(values, ps)
                u = torch.stack(
                    [torch.rand((), generator=self._generator(request_ids[i], params[i])) for i in group]
                )  # (len(group),) one draw per row from its own generator
                tokens[group] = order.gather(1, _draw(probs, u).unsqueeze(1)).squeeze(1)
        return tokens.tolist()


def _apply_penalties(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[Sequence[int]]
) -> torch.Tensor:
    """llama.cpp's repetition penalty: a seen token's logit is divided by the penalty when positive,
    multiplied when negative.  Returns a new tensor only when some row has a penalty."""
    rows = [i for i, p in enumerate(params) if p.repeat_penalty != 1.0 and histories[i]]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        seen = torch.tensor(sorted(set(histories[i][-REPEAT_LAST_N:])), dtype=torch.long)
        values = logits[i, seen]
        penalty = params[i].repeat_penalty
        logits[i, seen] = torch.where(values > 0, values / penalty, values * penalty)
    return logits


def candidates(logits: torch.Tensor, params: Sequence[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens any row may keep, best first: (sorted logits, token ids), both (rows, k).  k is the largest
    top-k of the batch, so with top-k on (the default, 40) this is a partial sort of a few candidates instead
    of sorting the whole vocabulary (~50x faster at vocab 49152)."""
    vocab = logits.shape[-1]
    k = max(p.top_k if 0 < p.top_k < vocab else vocab for p in params)
    if k < vocab:
        return logits.topk(k, dim=-1, sorted=True)
    return logits.sort(dim=-1, descending=True)


def filtered_sorted_probs(sorted_logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Probabilities of the sorted candidates after top-k, top-p, min-p and temperature, row by row.
    sorted_logits: (rows, k) float32, descending."""
    k = sorted_logits.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < k else k for p in params])  # (rows,)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)

    ranks = torch.arange(k).unsqueeze(0)
    keep = ranks < top_k.unsqueeze(1)
    probs = sorted_logits.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    # top-p: keep the smallest prefix whose mass reaches top_p (the token that crosses it is kept).
    mass_before = probs.cumsum(dim=-1) - probs
    keep &= mass_before < top_p.unsqueeze(1)
    # min-p: relative to the most likely token (rank 0).
    keep &= probs >= min_p.unsqueeze(1) * probs[:, :1]
    keep[:, 0] = True  # the best token always survives
    tempered = (sorted_logits / temperature.unsqueeze(1)).masked_fill(~keep, float("-inf"))
    return tempered.softmax(dim=-1)


def filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The whole-vocabulary distribution the sampler draws from: (rows, vocab).  For tests and inspection."""
    values, order = candidates(logits.float(), params)
    probs = filtered_sorted_probs(values, params)
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, order, probs)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the first token whose cumulative probability exceeds u.  probs: (rows, vocab)."""
    cdf = probs.cumsum(dim=-1)
    index = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1).contiguous(), right=True).squeeze(1)
    index = index.clamp_(max=probs.shape[-1] - 1)
    # searchsorted can land on a zero-probability token only through rounding at the very end: step back.
    bad = probs.gather(1, index.unsqueeze(1)).squeeze(1) == 0
    if bad.any():
        index[bad] = probs[bad].argmax(dim=-1)
    return index
