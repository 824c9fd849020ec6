"""The torch engine's loop: one `step()` schedules, runs the model once for the whole batch, samples, updates.

Single-threaded by design: the backend's engine thread owns the Engine; other threads talk to it through the
backend's queues.  The runner is anything with `execute(SchedulerOutput) -> RunnerOutput` (the real
ModelRunner, or a fake in tests); EOS, max_tokens and a full context are decided in `Scheduler.update`.

One request's failure is that request's alone: a request whose sampler state cannot be set up fails at
`add_request`; a row the sampler cannot sample, or a request whose stop check raises, is finished with
FINISHED_ERROR and reported as an update carrying its error (and its error_code when the error is typed: a
constraint's limit), while the other rows of the step go on.  A failure
of `runner.execute` (the batched forward) is raised: it is every running request's.

Speculative decoding (backends/torch_engine/speculative) is one optional hook on each side of the forward:
`speculator.expand` appends proposals to decode rows, `speculator.verify` turns a speculative row's logits into
the accepted proposals and one more token; the scheduler's update then takes 1 to k + 1 tokens for that row.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from backends.api import TokenLogprob
from backends.errors import HearthError
from backends.torch_engine.logprobs import chunk_prompt_logprobs, sampled_logprobs
from backends.torch_engine.parts import Runner
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.sampler import Sampler
from backends.torch_engine.scheduler import RequestUpdate, Scheduler, error_line
from backends.torch_engine.seams import RunnerOutput, SchedulerOutput

if TYPE_CHECKING:  # pragma: no cover
    from backends.torch_engine.speculative.speculator import Speculator


class Engine:
    def __init__(
        self, runner: Runner, scheduler: Scheduler, sampler: Sampler, speculator: Speculator | None = None
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.sampler = sampler
        self.speculator = speculator  # None: speculation off
        self.num_steps = 0

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises (and queues nothing) when its sampler state or its length is refused."""
        self.sampler.prepare(request.request_id, request.sampling)
        try:
            self.scheduler.add_request(request)
        except Exception:
            self.sampler.forget(request.request_id)
            raise

    def finish_request(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.scheduler.finish_request(request_id, status)
        self.forget(request_id)

    def forget(self, request_id: str) -> None:
        """Drop what the engine keeps for a request that ended outside step(): its sampler key and its
        speculation state (a draft model's blocks)."""
        self.sampler.forget(request_id)
        if self.speculator is not None:
            self.speculator.forget(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestUpdate]:
        """Run one batch; return what happened to each request that got a token or failed (finished ones
        included)."""
        started = time.perf_counter()
        out = self.scheduler.schedule()
        if out.is_empty:
            if out.has_swaps:  # a request swapped itself out and nothing ran: its copies must still be made
                self.runner.execute(out)
            return []
        if self.speculator is not None:
            out = self.speculator.expand(out, self.scheduler)
        result = self.runner.execute(out)
        if result.prompt_logits:
            self._score_prompts(out, result)
        sampled, failed = self._sample(out, result)
        logprobs = self._logprobs(result, sampled)
        updates = [
            RequestUpdate(self.scheduler.requests[rid], (), True, *_row_error(exc)) for rid, exc in failed.items()
        ]
        for u in updates:  # before update(), which then skips them: they are no longer running
            self.scheduler.finish_request(u.request.request_id, RequestStatus.FINISHED_ERROR)
        updates += self.scheduler.update(out, sampled)
        if logprobs:
            updates = [
                dataclasses.replace(u, logprobs=(logprobs[u.request.request_id],))
                if u.new_token_ids and u.request.request_id in logprobs
                else u
                for u in updates
            ]
        for u in updates:
            if u.finished:
                self.forget(u.request.request_id)
        self.num_steps += 1
        seconds = time.perf_counter() - started
        self.scheduler.observe_step(out.total_num_tokens, seconds)  # the TTFT plan's costs
        if self.speculator is not None:
            self.speculator.observe(out, seconds)  # which k pays
        return updates

    def _sample(
        self, out: SchedulerOutput, result: RunnerOutput
    ) -> tuple[dict[str, int | tuple[int, ...]], dict[str, Exception]]:
        """(request id -> sampled token, or a speculative row's tokens; request id -> the error its row raised)."""
        if not result.request_ids:
            return {}, {}
        sampled: dict[str, int | tuple[int, ...]] = {}
        failed: dict[str, Exception] = {}
        request_ids, logits = result.request_ids, result.logits
        if result.spec_logits:
            try:
                sampled.update(self.speculator.verify(result, out.scheduled, self.scheduler, self.sampler))  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the speculative rows' error, reported on their streams
                failed.update((rid, exc) for rid in result.spec_logits)
            keep = [i for i, rid in enumerate(request_ids) if rid not in result.spec_logits]
            request_ids, logits = tuple(request_ids[i] for i in keep), logits[keep]
            if not request_ids:
                return sampled, failed
        requests = [self.scheduler.requests[r] for r in request_ids]
        matchers = [r.matcher for r in requests]
        constrained = any(m is not None for m in matchers)
        rows = self.sampler.sample(
            logits,
            request_ids,
            [r.sampling for r in requests],
            [r.token_ids for r in requests],
            [r.num_prompt_tokens for r in requests],
            matchers if constrained else None,
        )
        for i, (matcher, token) in enumerate(zip(matchers, rows)):
            if matcher is not None and not isinstance(token, Exception):
                try:  # a constrained request's grammar advances with its token; refusing it fails that request
                    matcher.accept(token)
                except Exception as exc:  # noqa: BLE001 - that request's error, reported on its stream
                    rows[i] = exc
        sampled.update((rid, t) for rid, t in zip(request_ids, rows) if not isinstance(t, Exception))
        failed.update((rid, t) for rid, t in zip(request_ids, rows) if isinstance(t, Exception))
        return sampled, failed

    def _logprobs(self, result: RunnerOutput, sampled: dict[str, int | tuple[int, ...]]) -> dict[str, TokenLogprob]:
        """The sampled tokens' log-probabilities, for the rows whose requests ask (the others pay nothing)."""
        rows = [
            (i, rid)
            for i, rid in enumerate(result.request_ids)
            if rid in sampled and self.scheduler.requests[rid].sampling.logprobs is not None
        ]
        if not rows:
            return {}
        index = [i for i, _ in rows]
        logits = result.logits if len(index) == len(result.request_ids) else result.logits[index]
        values = sampled_logprobs(
            logits,
            [sampled[rid] for _, rid in rows],  # type: ignore[misc] - logprob rows never speculate
            [self.scheduler.requests[rid].sampling.logprobs or 0 for _, rid in rows],
        )
        return {rid: v for (_, rid), v in zip(rows, values)}

    def _score_prompts(self, out: SchedulerOutput, result: RunnerOutput) -> None:
        """Add the prompt log-probabilities a chunk scored to its request (SamplingParams.prompt_logprobs).  A
        chunk starting at position s rewrites the entries after s, so a recompute after preemption is harmless."""
        for s in out.scheduled:
            rows = result.prompt_logits.get(s.request_id)
            request = self.scheduler.requests.get(s.request_id)
            if rows is None or request is None:
                continue
            prompt = request.prompt_token_ids
            entries = request.prompt_logprobs[: s.start_position + 1]  # the first entry is set at creation
            entries += chunk_prompt_logprobs(rows, prompt, s.start_position, request.sampling.logprobs or 0)
            request.prompt_logprobs = entries


def _row_error(exc: Exception) -> tuple[str, str | None]:
    """(the one-line error, its error_code) for a row that failed: an error with an `error_code` (the
    constraint's ConstraintLimitError: "constraint_limit") is typed for the front ends and speaks for itself."""
    code = getattr(exc, "error_code", None)
    if isinstance(code, str) and isinstance(exc, HearthError):
        return exc.one_line(), code
    return error_line("sampling failed", exc), None
