"""The models one `hearth serve` has loaded, and loading another on demand (Ollama's model switching).

A request names a model; `ModelPool.acquire` returns it loaded, in its own runner, with its own admission queue
(app/server/runner.py) and keep_alive (app/server/keep_alive.py), and holds it busy until the request's response
has ended (the _Guard middleware closes the request's leases).  Another local model is loaded on demand:

- one load at a time, and requests for a model that is loading wait for that load (they do not start another);
- planned with the memory the loaded models hold counted as taken: the hardware report the server started with,
  less each loaded model's plan, device by device (`with_memory_taken`).  What a plan promises per device is
  what its engine allocates, so the plans of all loaded models fit together.  (A fresh probe would count a
  llama.cpp model's memory-mapped weights as available RAM, and plan a second model into them.);
- when the new model does not fit beside the others as it would fit alone (a plan error, or a worse placement:
  another engine, fewer layers on the GPUs, a shorter context), the least recently used idle model is unloaded
  and the plan made again, until it does or no idle model is left; a model with requests in flight is never
  unloaded (its requests finish first: the load waits for it, up to WAIT_FOR_IDLE_S);
- `--max-loaded-models N` unloads the least recently used idle model before an (N+1)th loads; by default as many
  stay loaded as fit;
- a model that cannot fit even alone gets a 507 naming the plan's reason; the loaded ones keep serving;
- a model whose keep_alive unloaded it leaves the pool (its memory is free again) and loads again, planned anew,
  on its next request.

Without an opener (a server made around one backend: tests, HEARTH_IN_PROCESS=1) the pool holds that one model,
and a request for another is a 404 saying how to serve it, as before model switching.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request as HTTPRequest
from starlette.concurrency import run_in_threadpool

from app.server.errors import APIError
from app.server.keep_alive import KeepAlive
from app.server.metrics import ServerMetrics
from app.server.ollama_models import CatalogEntry, same_model
from app.server.runner import Limits, Runner
from backends.api import Backend
from hwprobe.errors import HearthError, PlanError
from hwprobe.plan_types import DeviceMemory, Plan
from hwprobe.report import HardwareReport, with_memory_taken

WAIT_FOR_IDLE_S = 60.0  # how long a load waits for a busy model to become idle before it is refused (503)
LEASES = "hearth_leases"  # the request scope's state key for the models a request holds busy
log = logging.getLogger("hearth.server")


@dataclass
class Opened:
    """What the opener returns: the loaded backend, its registered name and its plan (None: unknown)."""

    backend: Backend
    name: str
    plan: Plan | None = None
    reasons: tuple[str, ...] = ()


# (registered name, hardware report to plan for or None for a probe) -> Opened; blocking (runs on a worker thread)
Opener = Callable[[str, HardwareReport | None], Opened]


@dataclass
class Served:
    """One loaded model: its backend, admission queue, keep_alive, plan and when it was last asked for."""

    name: str
    backend: Backend
    runner: Runner
    keep_alive: KeepAlive
    plan: Plan | None = None
    reasons: tuple[str, ...] = ()
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)

    @property
    def devices(self) -> tuple[DeviceMemory, ...]:
        return self.plan.devices if self.plan is not None else ()


class ModelPool:
    def __init__(
        self,
        first: Opened,
        *,
        limits: Limits,
        metrics: ServerMetrics,
        keep_alive_s: float | None,
        opener: Opener | None = None,
        report: HardwareReport | None = None,
        max_loaded: int | None = None,
        catalog: Callable[[], list[CatalogEntry]] | None = None,
    ) -> None:
        self.limits, self.metrics, self.keep_alive_s = limits, metrics, keep_alive_s
        self.opener, self.report, self.max_loaded, self.catalog = opener, report, max_loaded, catalog
        self.default = first.name  # what /health names; the model `hearth serve --model` loaded
        self.served: dict[str, Served] = {}
        self._loading: dict[str, asyncio.Future[Served]] = {}
        self._load_lock = asyncio.Lock()
        self._add(first)

    # -- what is loaded -------------------------------------------------------------------------------------
    def _add(self, opened: Opened) -> Served:
        name = opened.name
        # the Backend contract's notices (a runner that crashed and restarted, a safer configuration) go to the
        # server's log on stderr, as the chat app shows them
        opened.backend.on_notice = lambda text: log.warning("%s: %s", name, text)  # type: ignore[method-assign]
        runner = Runner(opened.backend, self.limits, self.metrics, gauges=self._gauges)
        served = Served(
            opened.name,
            opened.backend,
            runner,
            KeepAlive(opened.backend, self.keep_alive_s),
            opened.plan,
            opened.reasons,
        )
        self.served[opened.name] = served
        self.metrics.models_loaded.set(len(self.served))
        return served

    def _gauges(self) -> None:
        self.metrics.running.set(sum(s.runner.running for s in self.served.values()))
        self.metrics.queued.set(sum(s.runner.waiting for s in self.served.values()))

    def find(self, asked: str) -> Served | None:
        """The loaded model `asked` names (Ollama's `name:latest` too)."""
        return next((s for s in self.served.values() if same_model(asked, s.name)), None)

    def resident(self) -> list[Served]:
        """The models loaded now, most recently used first (a keep_alive-unloaded one is not)."""
        return sorted((s for s in self.served.values() if s.backend.resident), key=lambda s: -s.last_used)

    def first(self) -> Served | None:
        """The default model when it is in the pool, else the most recently used one; None when a failed load
        left the pool empty (status routes' subject)."""
        return self.served.get(self.default) or next(iter(self.resident()), None)

    def in_flight(self) -> int:
        return sum(s.keep_alive.in_flight for s in self.served.values())

    # -- a request's model --------------------------------------------------------------------------------------
    async def acquire(self, request: HTTPRequest | None, asked: str) -> tuple[Served, float]:
        """The model `asked` names, loaded (on demand), held busy until the request's response has ended; the
        seconds a load took (0 when it was loaded).  APIError: 404 for a model that is not registered, 507 for
        one that cannot fit even alone, 503 when the ones in the way stay busy."""
        started = time.perf_counter()
        served = self.find(asked)
        if served is not None and not served.backend.resident:  # keep_alive unloaded it
            if self.opener is None:
                served.last_used = time.monotonic()
                self._hold(request, served)
                return served, await served.keep_alive.load()
            await self._drop(served)
            served = None
        load_s = 0.0
        if served is None:
            served = await self._load_shared(self._registered(asked))
            load_s = time.perf_counter() - started  # waited for its load (this request's or another's)
        served.last_used = time.monotonic()
        self._hold(request, served)
        return served, load_s

    def _hold(self, request: HTTPRequest | None, served: Served) -> None:
        """Hold `served` busy until the request's response ends (the middleware closes its leases)."""
        if request is None:
            return
        leases = request.scope.setdefault("state", {}).get(LEASES)
        if isinstance(leases, contextlib.ExitStack):
            leases.enter_context(served.keep_alive.busy())

    def _registered(self, asked: str) -> str:
        """The registered name `asked` names; a 404 otherwise (saying how to serve it without an opener)."""
        entries = self.catalog() if self.catalog is not None else []
        found = next((e.name for e in entries if same_model(asked, e.name)), None)
        if found is not None and self.opener is not None:
            return found
        default = self.default
        if found is not None:
            why = (
                f"model {asked!r} is registered but this server serves {default!r}: start `hearth serve --model "
                f"{asked.removesuffix(':latest')}` to serve it"
            )
        elif self.opener is not None:
            why = f"model {asked!r} not found: `hearth models` lists the local ones (`hearth pull` adds one)"
        else:
            why = f"model {asked!r} not found: this server serves {default!r} (`hearth models` lists the others)"
        raise APIError(404, why, param="model", code="model_not_found")

    async def _load_shared(self, name: str) -> Served:
        """Load `name`, or wait for the load already running for it."""
        pending = self._loading.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._load(name))
            self._loading[name] = pending
            pending.add_done_callback(lambda _: self._loading.pop(name, None))
        return await asyncio.shield(pending)

    async def _load(self, name: str) -> Served:
        async with self._load_lock:
            if name in self.served:  # loaded while this waited for the lock
                return self.served[name]
            alone = await self._plan_alone(name)  # first: a model too large even alone unloads nothing
            await self._make_room_for_count()
            deadline = time.monotonic() + WAIT_FOR_IDLE_S
            while True:
                taken = self._taken_report()
                try:
                    if await run_in_threadpool(self._fits_as_alone, alone, name, taken):
                        opened = await run_in_threadpool(self.opener, name, taken)  # type: ignore[misc]
                        return self._add(opened)
                except PlanError as exc:
                    if not self.resident():
                        raise _too_large(name, exc) from None
                except HearthError as exc:  # a broken file, a runner that died loading it: this request's error
                    raise APIError(
                        500, f"cannot load {name!r}: {exc.one_line()}", type="server_error", code="model_load_failed"
                    ) from None
                if not await self._evict_one(deadline, name):
                    raise APIError(
                        503,
                        f"cannot load {name!r} now: it does not fit beside "
                        f"{', '.join(s.name for s in self.resident())}, which have requests running; retry shortly",
                        type="server_error",
                        code="models_busy",
                        headers={"Retry-After": "5"},
                    )

    async def _plan_alone(self, name: str) -> Plan | None:
        """The plan `name` would get with nothing else loaded; a 507 naming the reason when there is none."""
        plan_only = getattr(self.opener, "plan", None)
        if plan_only is None:
            return None
        try:
            return await run_in_threadpool(plan_only, name, self.report)
        except PlanError as exc:
            raise _too_large(name, exc) from None

    def _fits_as_alone(self, alone: Plan | None, name: str, taken: HardwareReport | None) -> bool:
        """Whether `name` planned beside the loaded models gets the placement it would get alone (or no loaded
        model is left to unload); PlanError when it does not fit at all."""
        if alone is None or not self.resident():
            return True
        plan_only = getattr(self.opener, "plan", None)
        beside = plan_only(name, taken) if plan_only is not None else alone
        return _placement(beside) >= _placement(alone)

    def _taken_report(self) -> HardwareReport | None:
        """The start-up report less what the loaded models' plans hold (None: probe, as without a report)."""
        if self.report is None:
            return None
        return with_memory_taken(self.report, [d for s in self.resident() for d in s.devices])

    async def _make_room_for_count(self) -> None:
        if self.max_loaded is None:
            return
        deadline = time.monotonic() + WAIT_FOR_IDLE_S
        while len(self.resident()) >= self.max_loaded:
            if not await self._evict_one(deadline, None):
                raise APIError(
                    503,
                    f"--max-loaded-models {self.max_loaded}: every loaded model has requests running; retry shortly",
                    type="server_error",
                    code="models_busy",
                    headers={"Retry-After": "5"},
                )

    async def _evict_one(self, deadline: float, loading: str | None) -> bool:
        """Unload the least recently used idle model, waiting (until `deadline`) for one to become idle; False
        when none did."""
        while True:
            idle = [s for s in reversed(self.resident()) if s.keep_alive.in_flight == 0]
            if idle:
                victim = idle[0]
                log.info("unloading %s to make room for %s", victim.name, loading or "another model")
                await self._drop(victim)
                return True
            if not self.resident() or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)

    async def _drop(self, served: Served) -> None:
        self.served.pop(served.name, None)
        self.metrics.models_loaded.set(len(self.served))
        await run_in_threadpool(served.backend.close)

    async def unload(self, asked: str) -> bool:
        """Ollama's keep_alive 0 on an empty request: unload the model now (False when it was not loaded)."""
        served = self.find(asked)
        if served is None:
            return False
        if self.opener is None:
            return await served.keep_alive.unload_now()
        await self._drop(served)
        return True

    def close(self) -> None:
        for served in list(self.served.values()):
            served.backend.close()
        self.served.clear()

    def abort_all(self) -> None:
        for served in self.served.values():
            for request_id in list(served.runner.active):
                served.backend.abort(request_id)


def _too_large(name: str, exc: HearthError) -> APIError:
    return APIError(
        507,
        f"{name!r} cannot be loaded on this machine even alone: {exc.one_line()}",
        type="server_error",
        code="model_too_large",
    )


def _placement(plan: Plan) -> tuple[Any, ...]:
    """How good a plan's placement is, comparable: whole-GPU before offload, more layers on the GPUs, then a
    longer context (a plan beside others is as good as alone when these are equal)."""
    on_gpu = sum(1 for d in plan.devices if d.kind == "gpu" and d.used)
    return (on_gpu, plan.n_gpu_layers, plan.ctx)
