"""A draft model proposes: a smaller model with the target's vocabulary, in the same engine, with its own paged KV.

Each request has a shadow sequence in the draft's own pool (its own BlockManager, prefix caching included: two
requests with one system prompt share the draft's blocks as they share the target's).  A step:
1. catch up: the draft computes the tokens the target accepted since its last step (the whole prompt the first
   time, in chunks of n_batch), after rolling its shadow back to the longest prefix it shares with the target's
   tokens (its own rejected proposals are dropped: `num_computed_tokens` moves back and blocks past it return);
2. k times: one batched forward of one token per row (rows drop out when their k is reached), each row drawing
   its next proposal: the argmax for greedy requests, else from the draft's distribution filtered with the
   request's own top-k / top-p / min-p / temperature, which is q in the rejection rule (verify.py).
So the target's KV never holds a rejected token and the draft's rolls back the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from backends.api import LoadOptions, SamplingParams, seed_u64
from backends.errors import ConfigError
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.draw import draw_index, kept_probs, uniforms
from backends.torch_engine.request import EngineRequest
from backends.torch_engine.speculative.proposer import Proposal

_DRAFT_NOISE = 0xD7AF7  # keeps the draft's draws apart from the verification's (same seed)


def draft_options(options: LoadOptions) -> LoadOptions:
    """The draft's LoadOptions: the target's device, dtype and pool shape (max_num_seqs x n_ctx, what the plan
    prices), no speculation of its own, one rank."""
    return dataclasses.replace(
        options, speculative="off", draft_model=None, kv_cache_bytes=None, tensor_parallel=1, n_gpu_layers=-1
    )


def check_same_vocabulary(target: Any, draft: Any, target_vocab: int, draft_vocab: int, name: str) -> None:
    """ConfigError unless the two tokenizers give every id the same bytes (proposals are token ids)."""
    hint = "pick a draft model of the same family (the same tokenizer), or use --speculative ngram"
    if target_vocab != draft_vocab:
        raise ConfigError(f"the draft model {name} has {draft_vocab} tokens, the target {target_vocab}", hint)
    for lo in range(0, target_vocab, 4096):
        ids = range(lo, min(lo + 4096, target_vocab))
        if any(target.token_bytes([i]) != draft.token_bytes([i]) for i in ids):
            bad = next(i for i in ids if target.token_bytes([i]) != draft.token_bytes([i]))
            raise ConfigError(f"the draft model {name} spells token {bad} differently from the target", hint)


class DraftProposer:
    name = "draft"

    def __init__(self, runner: Any, max_num_seqs: int, n_batch: int) -> None:
        """runner: the draft's ModelRunner (forward(seqs, "last") over its own pool of runner.num_blocks)."""
        self.runner = runner
        self.n_batch = n_batch
        self.block_manager = BlockManager(runner.num_blocks)
        self.max_num_seqs = max_num_seqs
        self._seqs: dict[str, EngineRequest] = {}  # request id -> its shadow in the draft's pool

    def forget(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self.block_manager.free(seq)

    def describe(self) -> dict[str, Any]:
        info = self.runner.describe()
        return {
            "draft_weight_bytes": info.get("weight_bytes", 0),
            "draft_kv_cache_bytes": info.get("kv_cache_bytes", 0),
        }

    def _shadow(self, request: EngineRequest) -> EngineRequest:
        seq = self._seqs.get(request.request_id)
        target = request.token_ids
        if seq is None:
            seq = EngineRequest(request.request_id, tuple(target), request.sampling)
            self._seqs[request.request_id] = seq
            cached = self.block_manager.find_cached_prefix(seq)
            if cached and not self.block_manager.allocate(seq, 0, cached):
                pass  # no room for the cached blocks: computed from scratch below
            return seq
        common = 0
        limit = min(seq.num_computed_tokens, len(target))
        while common < limit and seq.token_ids[common] == target[common]:
            common += 1
        # its own rejected proposals' KV is dropped; the last token is always run again (its logits propose)
        seq.num_computed_tokens = min(common, len(target) - 1)
        seq.token_ids = list(target)
        self.block_manager.trim(seq)
        return seq

    @torch.inference_mode()
    def propose(self, requests: Sequence[EngineRequest], ks: Sequence[int]) -> list[Proposal]:
        seqs = [self._shadow(r) for r in requests]
        live = list(range(len(requests)))
        # 1. catch up to the target's tokens; the last forward of each row gives its first proposal's logits
        last_logits: dict[int, torch.Tensor] = {}
        while live:
            todo = []
            for i in live:
                seq = seqs[i]
                n = min(seq.num_tokens - seq.num_computed_tokens, self.n_batch)
                if not self.block_manager.allocate(seq, n):
                    self.forget(seq.request_id)
                    continue  # the draft's pool is full: no proposal for this row this step
                todo.append((i, n))
            if not todo:
                break
            logits = self._forward([(seqs[i], n) for i, n in todo])
            live = []
            for row, (i, n) in enumerate(todo):
                seqs[i].num_computed_tokens += n
                self.block_manager.cache_full_blocks(seqs[i])
                if seqs[i].num_computed_tokens < seqs[i].num_tokens:
                    live.append(i)
                else:
                    last_logits[i] = logits[row]
        # 2. draw the proposals, one batched one-token forward per further position
        drafts: dict[int, list[int]] = {i: [] for i in last_logits}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in last_logits}
        active = sorted(last_logits)
        while active:
            rows = torch.stack([last_logits[i] for i in active])
            positions = [requests[i].num_tokens + len(drafts[i]) for i in active]
            for i, (token, q) in zip(active, self._draw(rows, [requests[i] for i in active], positions)):
                drafts[i].append(token)
                if q is not None:
                    probs[i].append(q)
            active = [i for i in active if len(drafts[i]) < ks[i]]
            step = []
            for i in active:
                seq = seqs[i]
                seq.token_ids.append(drafts[i][-1])
                if self.block_manager.allocate(seq, 1):
                    step.append(i)
            if not step:
                break
            logits = self._forward([(seqs[i], 1) for i in step])
            for row, i in enumerate(step):
                seqs[i].num_computed_tokens += 1
                last_logits[i] = logits[row]
            active = step
        out = []
        for i in range(len(requests)):
            tokens = tuple(drafts.get(i, ()))[: ks[i]]
            q = torch.stack(probs[i][: len(tokens)]) if probs.get(i) else None
            out.append(Proposal(tokens, q))
        return out

    def _forward(self, rows: Sequence[tuple[EngineRequest, int]]) -> torch.Tensor:
        """(len(rows), vocab) float32 logits after each row's next n tokens."""
        seqs = [
            (
                seq.token_ids[seq.num_computed_tokens : seq.num_computed_tokens + n],
                seq.num_computed_tokens,
                seq.block_ids,
            )
            for seq, n in rows
        ]
        decodes = sum(1 for _, n in rows if n == 1)
        if decodes not in (0, len(rows)):
            decodes = None  # mixed: the layers choose their kernels by row count
        return self.runner.forward(seqs, "last", num_decodes=decodes).float()

    def _draw(
        self, logits: torch.Tensor, requests: Sequence[EngineRequest], positions: Sequence[int]
    ) -> list[tuple[int, torch.Tensor | None]]:
        """Each row's next proposal and q, the distribution it was drawn from (None: greedy, a point mass)."""
        out: list[tuple[int, torch.Tensor | None]] = []
        for row, request, position in zip(logits, requests, positions):
            params: SamplingParams = request.sampling
            if params.greedy:
                out.append((int(row.argmax()), None))
                continue
            q = kept_probs(row.unsqueeze(0), [params])[0]  # no vocabulary sort under a top-k
            seed = seed_u64(params.seed) if params.seed is not None else hash(request.request_id) & (2**64 - 1)
            u = float(uniforms([seed ^ _DRAFT_NOISE], [position])[0])
            out.append((draw_index(q, u), q))
        return out
