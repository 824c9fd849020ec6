"""The n choices of one API request (OpenAI's `n`), each its own backend generation.

Choice 0 is opened first: its admission and its STARTED decide the HTTP status (a prompt too long is a 400
before anything streams).  The others are opened once it has started: on the torch engine its prompt's full
blocks are in the prefix cache by then, so the other choices reuse them instead of computing the prompt again,
and they decode in one batch with it.  A backend that serves one request at a time (llama.cpp) runs them one
after another.  Each choice's events are forwarded as they come, tagged with the choice's index, so a stream
interleaves them (every chunk names its `index`).

Seeds: with a seed, choice i samples with seed + i (wrapped into 64 bits), so a request is reproducible and
its choices differ.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from app.server.errors import APIError, internal_error
from app.server.runner import Generation, Runner
from backends.api import SEED_MAX, Request, seed_u64


def choice_requests(request: Request, n: int) -> list[Request]:
    """n copies of `request`, each with its own request id and (when seeded) seed + i."""
    out = [request]
    for i in range(1, n):
        sp = request.sampling
        seed = sp.seed if sp.seed is None else (sp.seed + i if sp.seed + i <= SEED_MAX else seed_u64(sp.seed + i))
        out.append(
            dataclasses.replace(
                request, request_id=f"{request.request_id}-{i}", sampling=dataclasses.replace(sp, seed=seed)
            )
        )
    return out


_DONE = object()


class Choices:
    """`open()` then iterate `events()`: (index, Generation, event) for every TOKEN and FINISHED event of every
    choice, and (index, Generation, None) once when a choice has started (its STARTED is `gen.started`).  An
    APIError of a later choice (refused admission) comes as (index, None, error).  Leaving the iteration early
    (client gone) cancels every choice, which aborts its backend request."""

    def __init__(self, runner: Runner, requests: list[Request]) -> None:
        self.runner = runner
        self.requests = requests
        self.first: Generation | None = None

    async def open(self) -> Generation:
        self.first = await self.runner.open(self.requests[0])
        return self.first

    async def events(self) -> AsyncIterator[tuple[int, Generation | None, Any]]:
        assert self.first is not None, "open() first"
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, gen: Generation | None) -> None:
            try:
                if gen is None:
                    gen = await self.runner.open(self.requests[index])
                queue.put_nowait((index, gen, None))
                async for event in gen.events():
                    queue.put_nowait((index, gen, event))
            except APIError as exc:
                queue.put_nowait((index, None, exc))
            except Exception as exc:  # noqa: BLE001 - a bug: the choice ends with a logged 500, never silently
                queue.put_nowait((index, None, internal_error(exc, f"choice {index} of {self.requests[0].request_id}")))
            except asyncio.CancelledError:
                if gen is not None:
                    gen.abort()  # idempotent: frees the slot even when events() never ran
                raise
            finally:
                queue.put_nowait((index, None, _DONE))

        tasks = [asyncio.ensure_future(pump(0, self.first))]
        tasks += [asyncio.ensure_future(pump(i, None)) for i in range(1, len(self.requests))]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item[2] is _DONE:
                    remaining -= 1
                    continue
                yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
