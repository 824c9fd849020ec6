"""Batched next-token sampling: every row of a step in a few tensor ops, seeded rows reproducible in any batch.

A step's rows go through, in llama.cpp's order (what the llama.cpp backend does with the same SamplingParams):
logit_bias and OpenAI's presence/frequency penalties (backends.torch_engine.penalties; one scatter-add for the
batch) -> the grammar masks of constrained rows (grammar_mask.py: no bias brings a forbidden token back) ->
llama.cpp's repetition penalty (one gather and one scatter for the batch) -> greedy rows: one argmax ->
sampled rows: top-k, top-p, min-p, temperature and the draw (backends.torch_engine.draw: a few groups of rows,
never a loop over rows).

Reproducibility: a request's noise is a counter-based generator (draw.uniforms: SplitMix64 keyed by the request's
seed, or by a key from the sampler's own seeded source when it has none, and counted by the tokens it has drawn),
so a request's n-th token sees the same number alone, in a batch, after a preemption or in a retry; and every
tensor op is row-wise (draw.py says why the bits agree).  No per-row generator object, no per-row call.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from backends.api import SamplingParams, seed_u64
from backends.torch_engine.draw import Scratch, draw, filtered_probs, noise_key, uniforms
from backends.torch_engine.grammar_mask import apply_grammar_masks
from backends.torch_engine.penalties import (
    apply_bias_and_openai_penalties,
    apply_repetition_penalty,
    has_openai_adjustments,
)

__all__ = ["Sampler", "filtered_probs"]


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._keys: dict[str, int] = {}  # request id -> its noise key (uint64)
        self._drawn: dict[str, int] = {}  # request id -> numbers it has drawn: the generator's counter
        self._seed_source = random.Random(seed)  # keys for requests that bring no seed
        self._scratch = Scratch()

    def prepare(self, request_id: str, params: SamplingParams) -> None:
        """Give a request its noise key when it is added (greedy requests draw nothing and get none)."""
        if not params.greedy:
            self._key(request_id, params)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's key and counter."""
        self._keys.pop(request_id, None)
        self._drawn.pop(request_id, None)

    def _key(self, request_id: str, params: SamplingParams) -> int:
        key = self._keys.get(request_id)
        if key is None:
            # SamplingParams takes any 64-bit seed, signed or unsigned: seed_u64 gives both spellings one key
            key = noise_key(seed_u64(params.seed)) if params.seed is not None else self._seed_source.getrandbits(64)
            self._keys[request_id] = key
            self._drawn[request_id] = 0
        return key

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

        The batch is sampled in one go; if that raises, the rows are sampled one by one, so the rows that can be
        sampled get the token they would have got in the batch (a row's draw is its own, see the module
        docstring) and each failing row gets its own error.  A request's counter moves only when its row
        returns a token."""
        assert logits.dim() == 2 and logits.shape[0] == len(request_ids) == len(params) == len(histories)
        # the generated tokens, for the rows whose penalties count them (the others skip the copy)
        outputs = [
            h[n:] if has_openai_adjustments(p) else ()
            for h, n, p in zip(histories, num_prompt_tokens or [0] * len(histories), params)
        ]
        try:
            tokens: list[int | Exception] = list(
                self._sample_rows(logits, request_ids, params, histories, outputs, matchers)
            )
        except Exception:  # noqa: BLE001 - find the rows that fail, below
            tokens = []
            for i in range(len(request_ids)):
                try:
                    tokens.extend(
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
                    tokens.append(exc)
        for rid, p, token in zip(request_ids, params, tokens):
            if not p.greedy and not isinstance(token, Exception):
                self._drawn[rid] += 1
        return tokens

    def sample_ahead(
        self, logits: torch.Tensor, request_ids: Sequence[str], params: Sequence[SamplingParams], ahead: Sequence[int]
    ) -> list[int]:
        """The token plain decoding would draw for each row if its request had already drawn ahead[i] more
        numbers (speculative verification: a request's k + 1 positions in one call, speculative/verify.py).
        Rows of plain sampling only (no penalties, bias or grammar: the speculator keeps those rows out).  Moves
        no counter: advance() does, by the tokens the request keeps."""
        logits = logits.float()
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled:
            return logits.argmax(dim=-1).tolist()
        keys = [self._key(request_ids[i], params[i]) for i in sampled]
        counters = [self._drawn[request_ids[i]] + ahead[i] for i in sampled]
        u = torch.from_numpy(uniforms(keys, counters)).to(logits.device)
        if len(sampled) == len(params):  # one request's row (the usual case): no argmax nobody reads
            return draw(logits, params, u, self._scratch).tolist()
        tokens = logits.argmax(dim=-1)
        tokens[sampled] = draw(logits[sampled], [params[i] for i in sampled], u, self._scratch)
        return tokens.tolist()

    def advance(self, request_id: str, num_tokens: int) -> None:
        """Count num_tokens drawn by a sampled request (the tokens a verification kept)."""
        if request_id in self._drawn:
            self._drawn[request_id] += num_tokens

    def _sample_rows(
        self,
        logits: torch.Tensor,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        outputs: Sequence[Sequence[int]],
        matchers: Sequence[Any] | None = None,
    ) -> list[int]:
        """The rows' tokens; reads the counters, never moves them (sample() does, for the rows that succeed)."""
        logits = apply_bias_and_openai_penalties(logits.float(), params, outputs)
        logits = apply_grammar_masks(logits, matchers)  # after the bias: no bias brings a forbidden token back
        logits = apply_repetition_penalty(logits, params, histories)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled:
            return logits.argmax(dim=-1).tolist()
        keys = [self._key(request_ids[i], params[i]) for i in sampled]
        u = torch.from_numpy(uniforms(keys, [self._drawn[request_ids[i]] for i in sampled])).to(logits.device)
        if len(sampled) == len(params):
            return draw(logits, params, u, self._scratch).tolist()
        greedy = [i for i, p in enumerate(params) if p.greedy]
        tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
        tokens[greedy] = logits[greedy].argmax(dim=-1)
        tokens[sampled] = draw(logits[sampled], [params[i] for i in sampled], u, self._scratch)
        return tokens.tolist()
