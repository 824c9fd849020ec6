"""Bridges the blocking `Backend.stream()` iterator to asyncio, with admission control.

Each admitted request runs `backend.stream()` on its own thread, which hands events to the event loop through
an asyncio.Queue, so the loop never blocks on the model.  A backend with `stream_to(request, sink)` (the
RunnerBackend every served model runs behind) hands its events to the loop from the thread that receives them
from the runner, with no thread per request: on a 2-core machine shared with the engine, every thread woken per
token is time taken from the batch.  Admission (app/server/admission.py): at most `slots` generations run at once
(max-concurrency for a backend that batches; 1 for one that serialises, so "running" means what it says), and at
most `queue_limit` more wait, taken in priority order (then arrival); beyond that the request is refused (429,
Retry-After).  A backend that preempts (both local engines) also takes a request that outranks a running one past the
slot limit, and preempts for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from app.server.admission import Admission
from app.server.errors import APIError, engine_error
from app.server.metrics import ServerMetrics
from backends.api import Backend, EventKind, GenerationEvent, Request

_END = object()  # the thread's last item


@dataclass
class Limits:
    max_concurrency: int = 16  # generations running at once (backends that batch)
    queue_limit: int = 64  # generations waiting for a slot before new ones get 429
    max_body_bytes: int = 1 << 20  # request body size
    retry_after_s: int = 1  # Retry-After on 429
    shutdown_grace_s: float = 10.0  # running requests get this long to finish on SIGTERM, then are aborted


class Runner:
    def __init__(
        self, backend: Backend, limits: Limits, metrics: ServerMetrics, gauges: Callable[[], None] | None = None
    ) -> None:
        """`gauges`: sets the running and queued gauges when this runner's counts change (a server with several
        models sums theirs: app/server/pool.py); by default this runner's counts."""
        self.backend = backend
        self.limits = limits
        self.metrics = metrics
        self._set_gauges = gauges
        batches = backend.capabilities.concurrent_requests
        self.slots = limits.max_concurrency if batches else 1
        # both local engines preempt for priority; a remote server does not (it gets no priority: see remote)
        self.admission = Admission(self.slots, preempts=backend.capabilities.preempts)
        self.running = 0
        self.waiting = 0
        self.active: set[str] = set()  # request ids with a live backend stream

    def _gauges(self) -> None:
        if self._set_gauges is not None:
            self._set_gauges()
            return
        self.metrics.running.set(self.running)
        self.metrics.queued.set(self.waiting)

    async def open(self, request: Request) -> Generation:
        """Admit `request` and start it; returns once its first item (STARTED) arrived, so errors before the
        stream (prompt too long) become an APIError here, while the HTTP status can still be chosen."""
        if self.waiting >= self.limits.queue_limit and self.running >= self.slots:
            raise APIError(
                429,
                f"the server is busy: {self.running} requests running and {self.waiting} "
                f"queued (queue limit {self.limits.queue_limit}); retry shortly",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(self.limits.retry_after_s)},
            )
        arrived = time.perf_counter()
        self.waiting += 1
        self._gauges()
        try:
            await self.admission.acquire(request.priority)
        finally:
            self.waiting -= 1
        self.running += 1
        self._gauges()
        gen = Generation(self, request, arrived)
        try:
            await gen.start()
        except APIError:  # the stream ended before STARTED (prompt too long ...): nothing runs
            gen.release()
            raise
        except BaseException:  # cancelled (client gone) while waiting for STARTED: stop the backend request
            gen.abort()
            raise
        return gen


class Generation:
    """One running request: its thread, its queue of events, and the release of its slot (exactly once)."""

    def __init__(self, runner: Runner, request: Request, arrived: float) -> None:
        self.runner = runner
        self.request = request
        self.arrived = arrived
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started: GenerationEvent | None = None
        self.finished: GenerationEvent | None = None
        self._released = False
        self._thread_done = threading.Event()

    def _work(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            for event in self.runner.backend.stream(self.request):
                loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop: raised there as an APIError
            loop.call_soon_threadsafe(self.queue.put_nowait, exc)
        finally:
            self._thread_done.set()
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, _END)
            except RuntimeError:  # the loop is closed (server gone)
                pass

    def _deliver(self, loop: asyncio.AbstractEventLoop, item: GenerationEvent | BaseException) -> None:
        """stream_to's sink (any thread): the item, and after the last one the end marker, to the loop."""
        last = isinstance(item, BaseException) or item.kind is EventKind.FINISHED
        try:
            loop.call_soon_threadsafe(self._put, item, last)
        except RuntimeError:  # the loop is closed (server gone)
            pass
        if last:
            self._thread_done.set()

    def _put(self, item: GenerationEvent | BaseException, last: bool) -> None:
        self.queue.put_nowait(item)
        if last:
            self.queue.put_nowait(_END)

    async def start(self) -> None:
        self.runner.active.add(self.request.request_id)
        loop = asyncio.get_running_loop()
        stream_to = getattr(self.runner.backend, "stream_to", None)
        if stream_to is None:
            threading.Thread(
                target=self._work, args=(loop,), name=f"gen-{self.request.request_id}", daemon=True
            ).start()
        else:
            try:  # a thread only to send it: the runner may be restarting, and that waits
                await asyncio.to_thread(stream_to, self.request, lambda item: self._deliver(loop, item))
            except Exception as exc:  # noqa: BLE001 - raised below as an APIError, as from the thread
                self._put(exc, True)
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise engine_error(item, f"generation {self.request.request_id}")
        assert isinstance(item, GenerationEvent) and item.kind is EventKind.STARTED, item
        self.started = item
        if item.stats is not None:
            self.runner.metrics.prompt_tokens.inc(item.stats.prompt_tokens)

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """TOKEN* then FINISHED.  Leaving early (client gone, task cancelled) aborts the backend request."""
        last = None
        try:
            while True:
                item = await self.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise engine_error(item, f"generation {self.request.request_id}")
                now = time.perf_counter()
                if item.kind is EventKind.TOKEN and item.token_ids:
                    m = self.runner.metrics
                    m.generated_tokens.inc(len(item.token_ids))
                    if last is None:
                        m.observe_ttft(self.request.priority, now - self.arrived)
                    else:
                        m.tpot.observe((now - last) / len(item.token_ids))
                    last = now
                if item.kind is EventKind.FINISHED:
                    self.finished = item
                    self.runner.metrics.finished.labels(item.finish_reason.value).inc()
                    self.release()
                yield item
        finally:
            if self.finished is None:
                self.abort()

    def abort(self) -> None:
        """Stop the backend request now (client gone, shutdown); its slot is free at once."""
        if not self._released:
            self.runner.metrics.finished.labels("abort").inc()
            self.runner.backend.abort(self.request.request_id)
            self.release()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.runner.active.discard(self.request.request_id)
            self.runner.running -= 1
            self.runner._gauges()
            self.runner.admission.release(self.request.priority)
