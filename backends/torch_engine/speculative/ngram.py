"""Prompt lookup: propose the tokens that followed the last occurrence of the current suffix (pure Python).

For input-grounded tasks (summarise, quote, edit a given text or code) the reply copies spans of the prompt;
when the last n tokens (n from ngram_max down to ngram_min) appeared before, in the prompt or in the reply so far,
the tokens after that earlier occurrence are a good guess for the next ones (llama.cpp's lookup decoding, vLLM's
"[ngram]" proposer).  No extra model, no extra memory beyond an index of n-grams per request.

The index maps each n-gram to the position just after its latest occurrence and is extended as tokens arrive,
so a lookup costs O(ngram_max) per step instead of a scan over the history.  A request's tokens only ever grow
(rejected proposals are never appended), so the index stays valid across preemption and recompute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.torch_engine.request import EngineRequest
from backends.torch_engine.speculative.proposer import Proposal


@dataclass
class _Index:
    by_n: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)  # n -> n-gram -> continuation start
    upto: int = 0  # n-grams ending before this position are indexed


class NgramProposer:
    name = "ngram"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 2) -> None:
        assert 1 <= ngram_min <= ngram_max
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self._indexes: dict[str, _Index] = {}

    def propose(self, requests: Sequence[EngineRequest], ks: Sequence[int]) -> list[Proposal]:
        return [Proposal(self.lookup(r.request_id, r.token_ids, k)) for r, k in zip(requests, ks)]

    def lookup(self, key: str, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        if k <= 0:
            return ()
        index = self._indexes.setdefault(key, _Index({n: {} for n in range(self.ngram_min, self.ngram_max + 1)}))
        end = len(tokens) - 1  # the suffix ends at the last token: index the n-grams that end before it
        for j in range(index.upto, end):  # n-gram tokens[j - n + 1 : j + 1] is followed by position j + 1
            for n, grams in index.by_n.items():
                if j + 1 >= n:
                    grams[tuple(tokens[j - n + 1 : j + 1])] = j + 1
        index.upto = max(index.upto, end)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(tokens) < n:
                continue
            start = index.by_n[n].get(tuple(tokens[len(tokens) - n :]))
            if start is not None:
                return tuple(tokens[start : start + k])
        return ()

    def forget(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)
