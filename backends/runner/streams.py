"""One request's stream through a runner, as RunnerBackend (backends/runner/client.py) keeps it: what was handed
to the caller so far (`StreamState`) and what the caller gets for each item the runner sends (`translate`).

Items are a GenerationEvent, an ErrorInfo (stream() raised in the runner before STARTED) or a `Crash` (the runner
died or hung).  An error before STARTED is raised to the caller as the exception it is; after STARTED every
failure is a FINISHED event with FinishReason.ERROR, so a caller that saw text always gets its end.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backends.api import EventKind, FinishReason, GenerationEvent, Request, RequestStats
from backends.errors import RunnerCrashedError
from backends.runner import protocol as p
from backends.runner.process import RunnerProcess


@dataclass
class Crash:
    message: str  # one line: what died, how, during what, and what happens next


@dataclass
class StreamState:
    request: Request
    runner: RunnerProcess
    queue: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    started: bool = False  # STARTED was yielded to the caller
    tokens: int = 0  # TOKEN events yielded
    replays: int = 0  # times sent again to a new runner
    aborted: bool = False
    done: bool = False  # the last item (FINISHED or an exception) was handed over
    ended_well: bool = False  # the last item was FINISHED with STOP or LENGTH (the configuration finished a reply)
    # stream_to(): items are translated and handed to this from the thread that receives them, instead of
    # being queued for a caller's thread
    sink: Callable[[GenerationEvent | BaseException], None] | None = None


def translate(state: StreamState, item: Any) -> list[GenerationEvent | BaseException]:
    """What the caller gets for one item from the runner: events, or the exception to raise (an error before
    STARTED); sets state.done on the last one (and state.ended_well when it finished a reply)."""
    rid = state.request.request_id
    if state.done:
        return []
    if isinstance(item, GenerationEvent):
        if item.kind is EventKind.STARTED:
            if state.started:
                return []  # the STARTED of a request sent again after a crash
            state.started = True
        elif item.kind is EventKind.TOKEN:
            state.tokens += 1
        elif item.kind is EventKind.FINISHED:
            state.done = True
            state.ended_well = item.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        return [item]
    state.done = True
    if isinstance(item, p.ErrorInfo):  # stream() raised in the runner before STARTED
        if not state.started:
            try:
                p.raise_error(item)
            except Exception as exc:  # noqa: BLE001 - handed to the caller as it is
                return [exc]
        return [error_event(rid, item.message, None)]
    # Crash
    if not state.started:
        return [RunnerCrashedError(item.message)]
    return [error_event(rid, item.message, "runner_crashed")]


def error_event(rid: str, message: str, code: str | None) -> GenerationEvent:
    return GenerationEvent(
        EventKind.FINISHED,
        rid,
        finish_reason=FinishReason.ERROR,
        stats=RequestStats(),
        error=message,
        error_code=code,
    )


def aborted_event(rid: str) -> GenerationEvent:
    """The FINISHED event of a stream stopped before it ended (abort, close)."""
    return GenerationEvent(EventKind.FINISHED, rid, finish_reason=FinishReason.ABORT, stats=RequestStats())
