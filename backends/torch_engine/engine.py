"""The torch engine's loop: one `step()` schedules, runs the model once for the whole batch, samples, updates.

Single-threaded by design: the backend's engine thread owns the Engine; other threads talk to it through the
backend's queues.  The runner is anything with `execute(SchedulerOutput) -> RunnerOutput` (the real
ModelRunner, or a fake in tests); EOS, max_tokens and a full context are decided in `Scheduler.update`.
"""

from __future__ import annotations

from typing import Protocol

from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.sampler import Sampler
from backends.torch_engine.scheduler import RequestUpdate, Scheduler
from backends.torch_engine.seams import RunnerOutput, SchedulerOutput


class Runner(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput: ...


class Engine:
    def __init__(self, runner: Runner, scheduler: Scheduler, sampler: Sampler) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.sampler = sampler
        self.num_steps = 0

    def add_request(self, request: EngineRequest) -> None:
        self.scheduler.add_request(request)

    def finish_request(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.scheduler.finish_request(request_id, status)
        self.sampler.forget(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestUpdate]:
        """Run one batch; return what happened to each request that got a token (finished ones included)."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        result = self.runner.execute(out)
        tokens = self._sample(result)
        updates = self.scheduler.update(out, dict(zip(result.request_ids, tokens)))
        for u in updates:
            if u.finished:
                self.sampler.forget(u.request.request_id)
        self.num_steps += 1
        return updates

    def _sample(self, result: RunnerOutput) -> list[int]:
        if not result.request_ids:
            return []
        requests = [self.scheduler.requests[r] for r in result.request_ids]
        return self.sampler.sample(result.logits, result.request_ids, [r.sampling for r in requests],
                                   [r.token_ids for r in requests])
