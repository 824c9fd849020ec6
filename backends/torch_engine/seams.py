"""The seams inside the torch engine: what the scheduler hands the model runner, and what comes back.

Engine.step() = scheduler.schedule() -> runner.execute(SchedulerOutput) -> sampler -> scheduler.update().
vLLM v1's idea: a step is `{request_id: num_tokens}`, so a whole prefill, a prefill chunk and a decode are one
kind of thing: "run these N new tokens of this request, whose first `start_position` tokens are already in the
KV cache".  This module is pure Python (no torch import): the scheduler side depends on it and must stay
torch-free; `RunnerOutput.logits` is typed loosely for that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BLOCK_SIZE = 16  # tokens per KV-cache block (the paged KV cache's page)


@dataclass(frozen=True)
class ScheduledRequest:
    request_id: str
    token_ids: tuple[int, ...]  # the new tokens to run this step: a prompt chunk, or the one last sampled token
    start_position: int  # position of token_ids[0]: tokens of this request already in the KV cache
    block_table: tuple[int, ...]  # physical block ids covering positions [0, start_position + len(token_ids))
    needs_logits: bool  # True when the step reaches the end of the known tokens: sample a token after it
    # True when token_ids is the one token sampled last step (not prompt, not recompute after preemption).
    # The runner gives decode rows and prompt rows fixed kernels, so a row's numerics never depend on the batch.
    is_decode: bool = False
    # True when the request wants its prompt's log-probabilities (SamplingParams.prompt_logprobs) and this chunk
    # holds prompt tokens to score: the runner returns the logits after every token of the chunk (prompt_logits)
    all_logits: bool = False
    # speculative decoding: the last so many of token_ids are proposals (not yet the request's tokens) to verify;
    # the runner returns the logits after every token of the row (RunnerOutput.spec_logits) and the scheduler
    # keeps the KV of the accepted ones only (backends/torch_engine/speculative)
    num_spec_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end_position(self) -> int:
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledRequest, ...]  # batch order; decodes first, then prefill chunks
    preempted_ids: tuple[str, ...] = ()  # requests pushed back to waiting this step (their blocks freed or swapped)
    finished_ids: tuple[str, ...] = ()  # requests removed since the last step (aborted or done)
    # KV blocks to copy before the forward (a GPU engine with swap space, BlockManager.swap_out / swap_in):
    # first every (device block, host slot) out, then every (host slot, device block) in.  A step may hold
    # copies and no tokens (a request preempted itself); the runner still makes them.
    swap_out: tuple[tuple[int, int], ...] = ()
    swap_in: tuple[tuple[int, int], ...] = ()

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        """vLLM's vocabulary: {request_id: tokens to run this step}."""
        return {s.request_id: s.num_tokens for s in self.scheduled}

    @property
    def total_num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def has_swaps(self) -> bool:
        return bool(self.swap_out or self.swap_in)


@dataclass
class RunnerOutput:
    request_ids: tuple[str, ...]  # the scheduled requests with needs_logits, in batch order
    logits: Any  # torch.Tensor (len(request_ids), vocab_size), float32
    extra: dict[str, Any] = field(default_factory=dict)  # timings etc., for stats
    # request id -> (num_tokens, vocab) float32 logits after every token of its chunk, for the scheduled
    # requests with all_logits (prompt log-probabilities); the last row is also that request's row in `logits`
    prompt_logits: dict[str, Any] = field(default_factory=dict)
    # request id -> (num_spec_tokens + 1, vocab) float32 logits after every token of a speculative row (the last
    # sampled token, then each proposal), for the scheduled requests with num_spec_tokens > 0
    spec_logits: dict[str, Any] = field(default_factory=dict)
