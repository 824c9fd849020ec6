"""One request's state inside the torch engine (pure Python: the scheduler and block manager depend on it).

vLLM's bookkeeping: a request is its token ids (prompt, then outputs appended as they are sampled) and a count
`num_computed_tokens` of how many of them are already in the KV cache.  Prefill, a prefill chunk, a decode and
a recompute after preemption are then all "run tokens [num_computed_tokens, num_tokens)".
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from backends.api import SamplingParams, TokenLogprob


class RequestStatus(enum.IntEnum):
    """Where a request is.  Invariant: every status greater than PREEMPTED is finished (`is_finished`), so
    `status > RequestStatus.PREEMPTED` is the test and new finished kinds go at the end."""

    WAITING = 0  # queued, holds no blocks
    RUNNING = 1  # in the running batch, holds blocks for its computed tokens
    PREEMPTED = 2  # pushed back to waiting; its blocks were freed (tokens recomputed) or swapped out to host RAM
    FINISHED_STOPPED = 3  # an end-of-sequence token or a stop string
    FINISHED_LENGTH = 4  # max_tokens reached or the context is full
    FINISHED_ABORTED = 5  # abort() was called
    FINISHED_ERROR = 6  # the engine failed while it ran

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


@dataclass
class EngineRequest:
    """A request as the scheduler sees it.  Owned by the engine thread only (not thread-safe)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]  # the prompt, BOS included
    sampling: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()  # tokens that end the reply (unless sampling.ignore_eos)
    arrival_time: float = field(default_factory=time.perf_counter)  # seconds (perf_counter) when submitted
    priority: int = 0  # Request.priority: lower runs first (backends/priority.py)
    # aging (backends.priority.effective_priority): seconds spent waiting in earlier waits (a preempted request
    # keeps them), and when the current wait began (None while running)
    waited_s: float = 0.0
    queued_at: float | None = None
    token_ids: list[int] = field(default_factory=list)  # prompt + outputs; filled in __post_init__
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # leading token_ids whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at the first schedule (for stats)
    block_ids: list[int] = field(default_factory=list)  # block table: block i holds positions [16 i, 16 i + 16)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks registered so far
    # while swapped out (BlockManager.swap_out): its block table position by position, (False, device block
    # still held) or (True, host slot); empty otherwise
    swap_table: list[tuple[bool, int]] = field(default_factory=list)
    num_preemptions: int = 0  # times this request was pushed back (recomputed or swapped out)
    first_scheduled_time: float | None = None  # perf_counter when its prefill first ran
    first_token_time: float | None = None  # perf_counter when its first output token was sampled
    finished_time: float | None = None
    # constrained decoding: the grammar state (backends.constrained.Matcher), masked in the sampler and advanced
    # by the engine with each sampled token; None = unconstrained
    matcher: Any = None
    # sampling.prompt_logprobs: the entries scored so far, position by position (the engine fills them chunk by
    # chunk; complete when there is one per prompt token)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # speculative decoding: proposals verified for this request, and how many the target accepted
    num_spec_proposed: int = 0
    num_spec_accepted: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if self.sampling.prompt_logprobs and not self.prompt_logprobs:
            # the first prompt token has nothing before it: no log-probability (OpenAI's echo gives null)
            self.prompt_logprobs = [TokenLogprob(self.prompt_token_ids[0], None)]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def is_prefilling(self) -> bool:
        """More than the last sampled token is still to be computed (a prompt, or a recompute)."""
        return self.num_tokens - self.num_computed_tokens > 1

    @property
    def is_swapped_out(self) -> bool:
        return bool(self.swap_table)

    @property
    def prompt_logprobs_ready(self) -> bool:
        return len(self.prompt_logprobs) == self.num_prompt_tokens

    def waited(self, now: float) -> float:
        """Seconds this request has spent waiting for the engine, the current wait included."""
        return self.waited_s + (now - self.queued_at if self.queued_at is not None else 0.0)

    def append_output(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))
