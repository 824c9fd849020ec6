"""Continuous batching with chunked prefill and preemption (pure Python, no torch).

Every step the scheduler picks, under a token budget (`max_num_batched_tokens`, LoadOptions.n_batch):
1. running requests that decode (one token each), oldest first: a long prompt never stalls running streams;
2. running requests still prefilling, a chunk each, as far as the budget goes;
3. waiting requests, first come first served, up to `max_num_seqs` in the batch, taking their cached prefix
   from the block manager and a first chunk of their prompt.
When the pool has no block for a running request, the most recently arrived running request that has not been
scheduled this step is preempted: its blocks are freed, it goes to the front of the waiting queue, and its
tokens (prompt and outputs so far) are recomputed when it comes back.  A lone request always fits, because
`max_model_len` is capped at the pool's size, so this never deadlocks or crashes.

The scheduler is owned by one thread (the engine's); it is not thread-safe.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from backends.api import TokenLogprob
from backends.errors import ContextOverflowError
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.seams import ScheduledRequest, SchedulerOutput


@dataclass(frozen=True)
class RequestUpdate:
    """What one step did to one request, for the engine to report."""

    request: EngineRequest
    new_token_ids: tuple[int, ...]  # tokens sampled this step (0 or 1; up to k + 1 on a speculative row)
    finished: bool  # the request ended this step (request.status says how)
    error: str | None = None  # set when this request alone failed this step (status FINISHED_ERROR); one line
    error_code: str | None = None  # GenerationEvent.error_code for that error ("constraint_limit"), else None
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token when sampling.logprobs is set (the engine's)


def error_line(what: str, exc: BaseException) -> str:
    """One line naming what failed and how, for a request that fails alone."""
    text = " ".join(str(exc).split())
    return f"{what}: {type(exc).__name__}: {text}" if text else f"{what}: {type(exc).__name__}"


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
    ) -> None:
        assert max_num_seqs >= 1 and max_num_batched_tokens >= 1
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        pool_tokens = block_manager.num_blocks * block_manager.block_size
        self.max_model_len = min(max_model_len, pool_tokens)  # tokens one sequence may reach (prompt + output)
        self.requests: dict[str, EngineRequest] = {}  # every unfinished request, by id
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []  # in arrival order: the last is the first to be preempted
        self._finished_ids: list[str] = []  # removed since the last schedule(), reported to the runner
        self.num_preemptions = 0

    # -- requests in and out ------------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request.  Raises ContextOverflowError when its prompt leaves no room for one more token."""
        if request.num_prompt_tokens >= self.max_model_len:
            raise ContextOverflowError(
                f"the prompt is {request.num_prompt_tokens} tokens but the context is {self.max_model_len}",
                "shorten the conversation, or load the model with a larger --ctx",
            )
        assert request.request_id not in self.requests, f"duplicate request id {request.request_id}"
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> EngineRequest | None:
        """End a request wherever it is (abort, stop string, error), returning its blocks.  Unknown ids are
        ignored (the request may have finished already)."""
        assert status.is_finished
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._retire(request, status)
        return request

    def abort_all(self, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list[EngineRequest]:
        return [r for r in (self.finish_request(rid, status) for rid in list(self.requests)) if r is not None]

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # -- one step -----------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        taken: set[str] = set()
        preempted: list[str] = []

        decodes = [r for r in self.running if not r.is_prefilling]
        prefills = [r for r in self.running if r.is_prefilling]
        for request in decodes + prefills:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.block_manager.allocate(request, num_new):
                victim = self._pick_victim(taken)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                continue
            scheduled.append(self._scheduled(request, num_new))
            taken.add(request.request_id)
            budget -= num_new

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            request = self.waiting[0]
            # a cached prefix has no logits: a request that wants its prompt's log-probabilities computes it all
            fresh = request.num_computed_tokens == 0 and not request.sampling.prompt_logprobs
            cached = self.block_manager.find_cached_prefix(request) if fresh else []
            start = request.num_computed_tokens + len(cached) * self.block_manager.block_size
            num_new = min(request.num_tokens - start, budget)
            if not self.block_manager.allocate(request, num_new, cached):
                break  # waits for blocks to come back; FCFS, so nothing behind it jumps the queue
            self.waiting.popleft()
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.perf_counter()
                request.num_cached_tokens = len(cached) * self.block_manager.block_size
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(self._scheduled(request, num_new))
            taken.add(request.request_id)
            budget -= num_new

        finished: tuple[str, ...] = ()
        if scheduled:  # an empty step is not run, so its finished ids wait for the next one
            finished, self._finished_ids = tuple(self._finished_ids), []
        return SchedulerOutput(tuple(scheduled), preempted_ids=tuple(preempted), finished_ids=finished)

    def update(self, output: SchedulerOutput, sampled: dict[str, int | tuple[int, ...]]) -> list[RequestUpdate]:
        """Record a step: the scheduled tokens are now computed, `sampled` maps request id -> the token sampled
        after its step (for those with needs_logits); for a speculative row (num_spec_tokens > 0) the accepted
        proposals and then the token sampled after them.  Requests that ended are freed and returned finished."""
        updates: list[RequestUpdate] = []
        now = time.perf_counter()
        for s in output.scheduled:
            request = self.requests.get(s.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # finished (aborted) while the step ran
            try:
                update = self._update_one(request, s, sampled, now)
            except Exception as exc:  # noqa: BLE001 - this request's failure alone; the others' updates go on
                self.finish_request(request.request_id, RequestStatus.FINISHED_ERROR)
                update = RequestUpdate(request, (), True, error_line("the engine's update failed", exc))
            if update is not None:
                updates.append(update)
        return updates

    def _update_one(
        self, request: EngineRequest, s: ScheduledRequest, sampled: dict[str, int | tuple[int, ...]], now: float
    ) -> RequestUpdate | None:
        if not s.needs_logits:
            request.num_computed_tokens += s.num_tokens
            self.block_manager.cache_full_blocks(request)
            return None
        got = sampled[s.request_id]
        tokens = (got,) if isinstance(got, int) else tuple(got)
        assert 1 <= len(tokens) <= s.num_spec_tokens + 1
        # Speculative rows: the KV of the last sampled token and of the accepted proposals (tokens[:-1]) is
        # kept; the rejected proposals' positions are past num_computed_tokens, overwritten by later steps.
        request.num_computed_tokens += s.num_tokens - s.num_spec_tokens + len(tokens) - 1
        status = None
        emitted: list[int] = []
        for token in tokens:  # a stop inside the accepted proposals ends the reply there
            request.append_output(token)
            emitted.append(token)
            status = self._stop_status(request, token)
            if status is not None:
                break
        self.block_manager.cache_full_blocks(request)  # only blocks full of accepted tokens are hashed
        if s.num_spec_tokens:
            self.block_manager.trim(request)
        if request.first_token_time is None:
            request.first_token_time = now
        if status is not None:
            self.finish_request(request.request_id, status)
        return RequestUpdate(request, tuple(emitted), status is not None)

    # -- helpers ------------------------------------------------------------------------------------------
    def _scheduled(self, request: EngineRequest, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        return ScheduledRequest(
            request.request_id,
            tuple(request.token_ids[start:end]),
            start,
            tuple(request.block_ids),
            needs_logits=end == request.num_tokens,
            is_decode=num_new == 1 and start >= request.num_prompt_tokens,
            all_logits=request.sampling.prompt_logprobs and start < request.num_prompt_tokens - 1,
        )

    def _stop_status(self, request: EngineRequest, token: int) -> RequestStatus | None:
        if token in request.eos_token_ids and not request.sampling.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.sampling.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _pick_victim(self, taken: Iterable[str]) -> EngineRequest:
        """The most recently arrived running request not yet scheduled this step."""
        taken = set(taken)
        for request in reversed(self.running):
            if request.request_id not in taken:
                return request
        raise AssertionError("no running request left to preempt")  # the current request is never taken

    def _preempt(self, request: EngineRequest) -> None:
        self.running.remove(request)
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _retire(self, request: EngineRequest, status: RequestStatus) -> None:
        self.block_manager.free(request)
        request.status = status
        request.finished_time = time.perf_counter()
        self._finished_ids.append(request.request_id)
