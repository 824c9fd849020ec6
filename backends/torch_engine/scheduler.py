"""Continuous batching with chunked prefill, priorities, a TTFT target and preemption (pure Python, no torch).

Rank (backends/priority.py): lower `priority` first, then earlier arrival; a waiting request gains a level per
`aging_s` seconds waited, so nothing waits forever.  Every step walks the running and waiting requests in rank
order under a token budget (`max_num_batched_tokens`, LoadOptions.n_batch):
- a running request gets its next token (a decode) or its next prompt chunk;
- a waiting request is admitted with its cached prefix (block manager) and a first chunk, up to `max_num_seqs`
  in the batch.  When the batch is full or the pool has no blocks for it, the worst-ranked running request not
  yet scheduled this step is preempted for it, if the newcomer's priority is strictly better than that one's
  (aged) priority: an aged request stops being preempted, and requests of one priority never preempt each other
  (they wait their turn, oldest first).  When no request can make room, nothing ranked below it is admitted.
- a running request that needs a block the pool lacks preempts the worst-ranked running request not yet
  scheduled this step (possibly itself).
A preempted request goes back to waiting with everything it generated (and is admitted again only when the pool
can hold all of its tokens, so it is not preempted again mid-recompute by its own growth), and its KV either is
freed or, where
the engine has swap space (a GPU, `swap_cost` set), is swapped out to host RAM, whichever way back is cheaper
for its length (swap_cost.py).  When it comes back its tokens (prompt and outputs) are recomputed, taking what
is still in the prefix cache, or its blocks are swapped in (fresh device blocks, its block table rewritten), and
its next token is sampled as it would have been: its stream goes on with nothing repeated or missing (the
sampler keeps its seeded state).  The copies are SchedulerOutput.swap_out / swap_in, made by the runner before
the step's forward.  A lone request always fits, because `max_model_len` is capped at the pool's size: blocks
a swapped-out request still holds (shared with others) are given up (it is recomputed) when nothing else can
make room.

TTFT target (`ttft_target_s`): the best-ranked request still waiting for its first token (the head) is planned
for.  With the time a step takes learned from the steps that ran (step_cost.StepCostModel), the head gets its
chunk, and everything ranked after it (lower-priority decodes, other prompts) only as many tokens as keep the
head's prefill within the target.  When even the head's prefill alone would not make it (a long prompt, a slow
machine, a target already missed) nothing is held back: the plan never costs throughput for nothing.  Requests
ranked before the head are never held back for it.

The scheduler is owned by one thread (the engine's); it is not thread-safe.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from backends.api import TokenLogprob
from backends.errors import ContextOverflowError
from backends.priority import AGING_S, effective_priority
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.seams import ScheduledRequest, SchedulerOutput
from backends.torch_engine.step_cost import StepCostModel
from backends.torch_engine.swap_cost import SwapCost, swap_pays


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
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        *,
        ttft_target_s: float | None = None,
        aging_s: float = AGING_S,
        cost_model: StepCostModel | None = None,
        clock: Callable[[], float] = time.perf_counter,
        swap_cost: SwapCost | None = None,
    ) -> None:
        assert max_num_seqs >= 1 and max_num_batched_tokens >= 1
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        pool_tokens = block_manager.num_blocks * block_manager.block_size
        self.max_model_len = min(max_model_len, pool_tokens)  # tokens one sequence may reach (prompt + output)
        self.ttft_target_s = ttft_target_s  # None = no TTFT plan: the plain budget every step
        self.aging_s = aging_s
        self.cost_model = cost_model if cost_model is not None else StepCostModel()
        self.clock = clock  # perf_counter seconds, as EngineRequest.arrival_time
        # swapping out is possible (the block manager has host slots and the runner copies them); None = recompute
        self.swap_cost = swap_cost if block_manager.num_host_blocks else None
        self.requests: dict[str, EngineRequest] = {}  # every unfinished request, by id
        self.waiting: list[EngineRequest] = []  # unordered: every step ranks them (aging changes ranks)
        self.running: list[EngineRequest] = []
        self._finished_ids: list[str] = []  # removed since the last schedule(), reported to the runner
        self._arrivals = itertools.count()  # ties of arrival_time break by the order requests were added
        self._order: dict[str, int] = {}
        self.num_preemptions = 0
        self.num_swap_preemptions = 0  # of which swapped out (the others were recomputed)
        self._swap_out: list[tuple[int, int]] = []  # this step's copies (device block, host slot)
        self._swap_in: list[tuple[int, int]] = []  # (host slot, device block)
        self.num_deferred = 0  # running requests held back a step by the TTFT plan, over the scheduler's life

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
        self._order[request.request_id] = next(self._arrivals)
        request.queued_at = self.clock()
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> EngineRequest | None:
        """End a request wherever it is (abort, stop string, error), returning its blocks.  Unknown ids are
        ignored (the request may have finished already)."""
        assert status.is_finished
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        self._order.pop(request_id, None)
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

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """The engine's measure of the step that ran (its whole step), for the TTFT plan's cost model."""
        self.cost_model.observe(num_tokens, seconds)

    # -- one step -----------------------------------------------------------------------------------------
    def rank(self, request: EngineRequest, now: float) -> tuple[int, float, int]:
        """Sort key: (aged priority, arrival, order added); smaller runs first."""
        aged = effective_priority(request.priority, request.waited(now), self.aging_s)
        return (aged, request.arrival_time, self._order.get(request.request_id, 0))

    def schedule(self) -> SchedulerOutput:
        self.block_manager.release_swapped_in()  # the last step's copies ran
        now = self.clock()
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        taken: set[str] = set()
        preempted: list[str] = []
        order = sorted([*self.running, *self.waiting], key=lambda r: self.rank(r, now))
        head = next((r for r in order if r.num_output_tokens == 0), None)  # the TTFT plan's request
        cap: int | None = None  # tokens this step may hold in all, set by the TTFT plan; None = the budget alone
        used = 0
        planned = False  # the head was scheduled under the TTFT plan this step
        admitting = True  # strict rank order: once one waiting request cannot get in, none ranked below it does
        # running decodes still ahead in the walk: a prompt chunk leaves them a token each, so a long prompt
        # never stalls the streams that are generating (only the TTFT plan's head may take the whole budget,
        # while its first token can still come within the target)
        decodes_left = sum(1 for r in self.running if not r.is_prefilling)

        for request in order:
            decoding = request.status is RequestStatus.RUNNING and not request.is_prefilling
            decodes_left -= decoding
            if request.request_id in preempted:
                continue  # preempted earlier in this walk: back to waiting, not re-admitted in the same step
            room = budget if cap is None else min(budget, cap - used)
            if not decoding and not (request is head and self._ttft_attainable(request, room, now)):
                room -= min(decodes_left, max(room - 1, 0))  # a chunk of at least one token when there is room
            if room <= 0:
                if request.status is RequestStatus.RUNNING and planned:
                    self.num_deferred += 1  # held back for the head (its budget or its time)
                continue
            if request.status is RequestStatus.RUNNING:
                num_new = self._grow(request, room, taken, preempted)
            elif admitting:
                num_new = self._admit(request, room, taken, preempted, now)
                admitting = num_new > 0
            else:
                continue
            if num_new == 0:
                continue
            scheduled.append(self._scheduled(request, num_new))
            taken.add(request.request_id)
            budget -= num_new
            used += num_new
            if request is head and self.ttft_target_s is not None:
                planned = True
                cap = self._ttft_cap(request, num_new, used, now)

        finished: tuple[str, ...] = ()
        if scheduled:  # an empty step is not run, so its finished ids wait for the next one
            finished, self._finished_ids = tuple(self._finished_ids), []
        swap_out, swap_in = tuple(self._swap_out), tuple(self._swap_in)  # an empty step still copies these
        self._swap_out, self._swap_in = [], []
        return SchedulerOutput(
            tuple(scheduled), preempted_ids=tuple(preempted), finished_ids=finished, swap_out=swap_out, swap_in=swap_in
        )

    def _grow(self, request: EngineRequest, room: int, taken: set[str], preempted: list[str]) -> int:
        """Blocks for a running request's next tokens (its decode or prompt chunk), preempting the worst-ranked
        running request not yet scheduled this step (possibly itself) while the pool lacks them.  Returns the
        tokens scheduled, 0 when it was preempted."""
        num_new = min(request.num_tokens - request.num_computed_tokens, room)
        while not self.block_manager.allocate(request, num_new):
            victim = self._victim(taken, now=None)
            assert victim is not None  # the request itself is never taken yet
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return 0
        return num_new

    def _admit(self, request: EngineRequest, room: int, taken: set[str], preempted: list[str], now: float) -> int:
        """Move a waiting request into the batch with its cached prefix and first chunk, preempting worse-ranked
        running requests (see the module docstring) when the batch or the pool is full.  Returns the tokens
        scheduled, 0 when it stays waiting."""
        # a cached prefix has no logits: a request that wants its prompt's log-probabilities computes it all
        fresh = request.num_computed_tokens == 0 and not request.sampling.prompt_logprobs
        bm = self.block_manager
        cached: list[int] = []
        while True:
            if len(self.running) < self.max_num_seqs:
                if request.is_swapped_out:  # its KV comes back from host RAM, then its next tokens
                    num_new = min(request.num_tokens - request.num_computed_tokens, room)
                    if bm.can_swap_in(request, num_new):
                        self._swap_in += bm.swap_in(request)
                        assert bm.allocate(request, num_new)
                        break
                else:
                    cached = bm.find_cached_prefix(request) if fresh else []
                    start = request.num_computed_tokens + len(cached) * bm.block_size
                    num_new = min(request.num_tokens - start, room)
                    # A request coming back from a recompute returns only when all of it fits the pool: admitted
                    # a chunk at a time, two that each needed most of the pool took turns preempting each other
                    # mid-recompute and neither ever finished (the property test found it: 3 blocks, ~33 tokens
                    # each).  New requests still come in a chunk at a time.
                    whole = request.num_preemptions == 0 or bm.can_allocate(request, request.num_tokens - start, cached)
                    if whole and bm.allocate(request, num_new, cached):
                        break
            victim = self._victim(taken, now=now, newcomer=request)
            if victim is None and self._drop_swapped(request, now):
                continue
            if victim is None:
                return 0
            self._preempt(victim)
            preempted.append(victim.request_id)
        self.waiting.remove(request)
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
            request.num_cached_tokens = len(cached) * self.block_manager.block_size
        request.waited_s = request.waited(now)
        request.queued_at = None
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return num_new

    def _ttft_attainable(self, head: EngineRequest, room: int, now: float) -> bool:
        """Whether the head's first token can still come within the target if it takes `room` tokens now (its
        prefill alone); only then may it take the whole budget, ahead of the decodes ranked after it."""
        if self.ttft_target_s is None:
            return False
        remaining = head.num_tokens - head.num_computed_tokens  # an upper bound: a cached prefix only shortens it
        return self._ttft_cap(head, min(remaining, room), 0, now) is not None

    def _ttft_cap(self, head: EngineRequest, chunk: int, used: int, now: float) -> int | None:
        """Tokens this step may hold in all so that `head` (just given `chunk` tokens, `used` in the step so
        far) gets its first token within the target; None = hold nothing back (no target, no cost model yet,
        or not attainable even by the head's prefill alone)."""
        if self.ttft_target_s is None:
            return None
        left_s = self.ttft_target_s - (now - head.arrival_time)
        later = head.num_tokens - head.num_computed_tokens - chunk  # the head's tokens after this step's chunk
        full_steps, last = divmod(later, self.max_num_batched_tokens)
        est_chunk = self.cost_model.estimate(chunk)
        est_full = self.cost_model.estimate(self.max_num_batched_tokens)
        est_last = self.cost_model.estimate(last) if last else 0.0
        if est_chunk is None or est_full is None or est_last is None:
            return None
        allowance = left_s - full_steps * est_full - est_last  # what this step may take for the later steps to fit
        if allowance < est_chunk:
            return None
        fits = self.cost_model.max_tokens_within(allowance)
        return None if fits is None else max(fits, used)

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

    def _victim(
        self, taken: Iterable[str], now: float | None, newcomer: EngineRequest | None = None
    ) -> EngineRequest | None:
        """The worst-ranked running request not yet scheduled this step.  For a `newcomer` (admission), only
        one whose aged priority is strictly worse than the newcomer's priority, else None."""
        now = self.clock() if now is None else now
        candidates = [r for r in self.running if r.request_id not in taken]
        if newcomer is not None:
            candidates = [
                r for r in candidates if newcomer.priority < effective_priority(r.priority, r.waited(now), self.aging_s)
            ]
        return max(candidates, key=lambda r: self.rank(r, now), default=None)

    def _preempt(self, request: EngineRequest) -> None:
        self.running.remove(request)
        copies = self._swap_out_if_cheaper(request)
        if copies is None:
            self.block_manager.free(request)  # it will be recomputed
        else:
            self._swap_out += copies
            self.num_swap_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        request.queued_at = self.clock()
        self.num_preemptions += 1
        self.waiting.append(request)

    def _swap_out_if_cheaper(self, request: EngineRequest) -> list[tuple[int, int]] | None:
        """Swap the request's KV out when swapping is possible and cheaper than recomputing it (swap_cost.py):
        the copies to make, or None (free it: recompute)."""
        bm = self.block_manager
        if self.swap_cost is None or request.num_computed_tokens == 0:
            return None
        num_swap = bm.swap_out_size(request)
        held = len(request.block_ids[: bm.blocks_needed(request.num_computed_tokens)])
        staying = min((held - num_swap) * bm.block_size, request.num_computed_tokens)  # shared blocks stay
        c = self.cost_model.coefficients()
        if not swap_pays(self.swap_cost, num_swap, request.num_computed_tokens - staying, None if c is None else c[1]):
            return None
        return bm.swap_out(request)  # None when the host store is full

    def _drop_swapped(self, newcomer: EngineRequest, now: float) -> bool:
        """Make a waiting swapped-out request that still holds device blocks (shared ones) give them up: it
        will be recomputed.  The worst-ranked first; False when there is none (nothing more can make room)."""
        pinned = [r for r in self.waiting if r is not newcomer and r.is_swapped_out and r.block_ids]
        if not pinned:
            return False
        self.block_manager.drop_swapped(max(pinned, key=lambda r: self.rank(r, now)))
        return True

    def _retire(self, request: EngineRequest, status: RequestStatus) -> None:
        self.block_manager.free(request)
        request.status = status
        request.finished_time = time.perf_counter()
        self._finished_ids.append(request.request_id)
