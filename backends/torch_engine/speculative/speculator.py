"""The engine's hook: widen decode rows with proposals before the forward, verify them after it.

Which rows speculate: one-token decode rows of requests whose sampling the verification reproduces exactly (no
grammar, no logit bias, no presence / frequency / repetition penalty, no log-probabilities: those rows decode as
before, token by token).  Each row proposes and verifies its own tokens; rows without a proposal, or in their
back-off (proposer.SpecState), decode as before in the same batch.  Proposal tokens come out of the step's token
budget left after the scheduler's own choice (n_batch), so speculation never delays a prefill chunk.  Steps
with more than SpecConfig.max_batch_rows decode rows do not speculate at all (a big batch is compute-bound).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import torch

from backends.api import SamplingParams, seed_u64
from backends.torch_engine.request import EngineRequest
from backends.torch_engine.sampler import Sampler
from backends.torch_engine.scheduler import Scheduler
from backends.torch_engine.seams import RunnerOutput, ScheduledRequest, SchedulerOutput
from backends.torch_engine.speculative.cost import StepCosts, best_k
from backends.torch_engine.speculative.proposer import Proposal, Proposer, SpecConfig, SpecState
from backends.torch_engine.speculative.verify import accept_matching, check_proposal, rejection_row


def plain_sampling(params: SamplingParams) -> bool:
    """Whether verification reproduces this request's sampling (see the module docstring)."""
    return (
        not params.logit_bias
        and params.presence_penalty == 0.0
        and params.frequency_penalty == 0.0
        and params.repeat_penalty == 1.0
        and params.logprobs is None
    )


class Speculator:
    def __init__(self, proposer: Proposer, config: SpecConfig, seed: int = 0) -> None:
        self.proposer = proposer
        self.config = config
        self.states: dict[str, SpecState] = {}
        self._proposals: dict[str, Proposal] = {}  # this step's, by request id
        self._keys = random.Random(seed ^ 0x5EC)  # noise keys of unseeded sampled rows
        self.num_proposed = 0  # proposals verified since load
        self.num_accepted = 0  # of which accepted
        self.num_verifications = 0  # speculative rows run
        self.costs = StepCosts()  # measured step seconds by token count: which k pays (cost.py)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    def _state(self, request: EngineRequest) -> SpecState:
        state = self.states.get(request.request_id)
        if state is None:
            state = SpecState(min(self.config.k_start, self.config.k_max))
            if not request.sampling.greedy:
                seed = request.sampling.seed
                state.key = seed_u64(seed) if seed is not None else self._keys.getrandbits(64)
            self.states[request.request_id] = state
        return state

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        self._proposals.pop(request_id, None)
        self.proposer.forget(request_id)

    # -- before the forward -------------------------------------------------------------------------------
    def expand(self, out: SchedulerOutput, scheduler: Scheduler) -> SchedulerOutput:
        """The step with proposals appended to the rows that speculate (blocks allocated for them)."""
        self._proposals = {}
        for rid in out.preempted_ids:  # its KV is gone: a draft model's copy too
            self.proposer.forget(rid)
        if sum(1 for s in out.scheduled if s.is_decode) > self.config.max_batch_rows:
            return out  # a big batch: plain decodes (SpecConfig.max_batch_rows says why)
        budget = scheduler.max_num_batched_tokens - out.total_num_tokens
        step_tokens = out.total_num_tokens  # the step's tokens so far: each row's k is priced on top of them
        rows: list[tuple[int, EngineRequest, int]] = []
        for i, s in enumerate(out.scheduled):
            if budget <= 0:
                break
            request = scheduler.requests.get(s.request_id)
            if request is None or not s.is_decode or not s.needs_logits or request.matcher is not None:
                continue
            if not plain_sampling(request.sampling):
                continue
            state = self._state(request)
            room = min(
                request.sampling.max_tokens - request.num_output_tokens - 1,  # the step always adds one more
                scheduler.max_model_len - request.num_tokens - 1,
                budget,
            )
            if room <= 0 or not state.wants():
                continue
            k, _ = best_k(state.acceptance, min(state.k, room), self.costs, step_tokens)
            if k == 0:  # no k beats a plain decode at this acceptance and these step costs
                state.decline()
                continue
            rows.append((i, request, k))
            budget -= k
            step_tokens += k
        if not rows:
            return out
        proposals = self.proposer.propose([r for _, r, _ in rows], [k for _, _, k in rows])
        scheduled = list(out.scheduled)
        for (i, request, k), proposal in zip(rows, proposals):
            tokens = proposal.token_ids[:k]
            if not tokens or not scheduler.block_manager.allocate(request, 1 + len(tokens)):
                continue  # nothing to propose, or no block for the proposals: a plain decode
            s = scheduled[i]
            scheduled[i] = dataclasses.replace(
                s,
                token_ids=s.token_ids + tokens,
                block_table=tuple(request.block_ids),
                is_decode=False,  # a multi-token row: the runner's prompt-chunk path (lower-right causal mask)
                num_spec_tokens=len(tokens),
            )
            self._proposals[request.request_id] = Proposal(tokens, _cut(proposal.probs, len(tokens)))
        return dataclasses.replace(out, scheduled=tuple(scheduled))

    # -- after the step ----------------------------------------------------------------------------------
    def observe(self, out: SchedulerOutput, seconds: float) -> None:
        """Time a step without prompt chunks (decodes and speculative rows) by its tokens (cost.py)."""
        if all(s.is_decode or s.num_spec_tokens for s in out.scheduled):
            self.costs.observe(out.total_num_tokens, seconds)

    # -- after the forward --------------------------------------------------------------------------------
    def verify(
        self, result: RunnerOutput, scheduled: Sequence[ScheduledRequest], scheduler: Scheduler, sampler: Sampler
    ) -> dict[str, tuple[int, ...]]:
        """request id -> the accepted proposals and the token after them, for every speculative row.  Point-mass
        proposals are checked against the target's own tokens for every position, all rows in one batched
        sampler call (verify.py says why that is lossless); a sampled draft's rows take the rejection rule."""
        rows = [s for s in scheduled if s.num_spec_tokens]
        point = [s for s in rows if self._proposals[s.request_id].probs is None]
        tokens: dict[str, tuple[int, ...]] = {}
        if point:
            logits = [result.spec_logits[s.request_id] for s in point]
            for s, row_logits in zip(point, logits):
                check_proposal(self._proposals[s.request_id].token_ids, row_logits.shape[-1])
            ids = [s.request_id for s, row in zip(point, logits) for _ in range(row.shape[0])]
            params = [scheduler.requests[rid].sampling for rid in ids]
            ahead = [j for row in logits for j in range(row.shape[0])]
            stacked = logits[0] if len(logits) == 1 else torch.cat(logits)  # one stream: no copy
            targets = sampler.sample_ahead(stacked, ids, params, ahead)
            at = 0
            for s, row in zip(point, logits):
                n = row.shape[0]
                tokens[s.request_id] = accept_matching(targets[at : at + n], self._proposals[s.request_id].token_ids)
                at += n
        for s in rows:
            request = scheduler.requests[s.request_id]
            proposal = self._proposals[s.request_id]
            if proposal.probs is not None:
                state = self._state(request)
                tokens[s.request_id] = rejection_row(
                    result.spec_logits[s.request_id],
                    proposal.token_ids,
                    request.sampling,
                    proposal.probs,
                    state.key or 0,
                    request.num_tokens,
                )
        for s in rows:
            request = scheduler.requests[s.request_id]
            proposal, row = self._proposals[s.request_id], tokens[s.request_id]
            if proposal.probs is None and not request.sampling.greedy:
                sampler.advance(s.request_id, len(row))  # the plain sampler's counter: its draws were used
            accepted = len(row) - 1
            self._state(request).record(len(proposal.token_ids), accepted, self.config.k_max)
            self.num_proposed += len(proposal.token_ids)
            self.num_accepted += accepted
            self.num_verifications += 1
            request.num_spec_proposed += len(proposal.token_ids)
            request.num_spec_accepted += accepted
        return tokens

    def describe(self) -> dict[str, object]:
        return {
            "speculative": self.proposer.name,
            "speculative_k_max": self.config.k_max,
            "spec_proposed_tokens": self.num_proposed,
            "spec_accepted_tokens": self.num_accepted,
            "spec_acceptance_rate": round(self.acceptance_rate, 4),
        }


def _cut(probs, n: int):
    return None if probs is None else probs[:n]
