"""Ollama's keep_alive for the served model: unload it after it has been idle so long, load it again on demand.

Every request that uses the model (both APIs; status paths such as /health, /metrics, /api/ps, /api/tags do not
count) holds it busy while it runs (`busy()`), and when the last one ends the model's expiry is set: `now +` that
request's keep_alive (Ollama's field, on /api/*), else the server's default (`hearth serve --keep-alive`, forever
unless given).  Ollama's meaning: 0 unloads at once, a negative duration never.  A watcher task unloads the
model once its expiry has passed with nothing running (Backend.unload: the runner process ends, so all of its RAM
and VRAM go back to the system); the next request starts it again and Ollama's replies report that time as
load_duration.  A backend that cannot unload (the in-process engine, HEARTH_IN_PROCESS=1) stays loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from starlette.concurrency import run_in_threadpool

from backends.api import Backend

# paths that report on the model without using it: they neither keep it loaded nor load it again
STATUS_PATHS = frozenset({"/", "/health", "/metrics", "/api/ps", "/api/tags", "/api/version", "/v1/models"})


class KeepAlive:
    def __init__(self, backend: Backend, default_s: float | None) -> None:
        self.backend = backend
        self.default_s = default_s  # None = keep the model loaded forever
        self.in_flight = 0
        self.expires_at: float | None = None  # wall clock (time.time()); None = never
        self._next_s: float | None | bool = False  # the running request's keep_alive; False = not given
        self._task: asyncio.Task | None = None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self.in_flight += 1
        self.expires_at = None
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                keep = self.default_s if self._next_s is False else self._next_s
                self._next_s = False
                self.expires_at = None if keep is None else time.time() + keep
                self._wake()

    def request_keep_alive(self, seconds: float | None) -> None:
        """This request's keep_alive (seconds; None = forever): the expiry after it ends."""
        self._next_s = seconds

    def _wake(self) -> None:
        if self.expires_at is None or not self.backend.resident:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._watch())

    async def _watch(self) -> None:
        while self.expires_at is not None and self.backend.resident:
            wait = self.expires_at - time.time()
            if wait > 0:
                await asyncio.sleep(min(wait, 1.0))
                continue
            if self.in_flight == 0 and await run_in_threadpool(self.backend.unload):
                self.expires_at = None
                return
            await asyncio.sleep(0.2)  # a request slipped in: its end sets a new expiry

    async def unload_now(self) -> bool:
        """Ollama's empty request with keep_alive 0."""
        self.expires_at = None
        return bool(await run_in_threadpool(self.backend.unload))

    async def load(self) -> float:
        """Load the model if it was unloaded; the seconds it took (0 when it was loaded)."""
        if self.backend.resident:
            return 0.0
        started = time.perf_counter()
        await run_in_threadpool(self.backend.load)
        return time.perf_counter() - started
