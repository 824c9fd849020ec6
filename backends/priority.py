"""Request priority: the ranking rule every engine shares, and a lock that hands out turns by it (pure Python).

Rank (vLLM's priority policy, plus aging): lower `Request.priority` runs first, then earlier arrival.  Aging
keeps a low-priority request from waiting forever behind a steady stream of higher ones: every `AGING_S`
seconds it has spent waiting lift it one level (`effective_priority`).  Whole levels, not a continuous lift,
so that two requests of the same priority keep their arrival order instead of overtaking each other by the
millisecond.  With priorities bounded to PRIORITY_MIN..PRIORITY_MAX (backends.api) a request waits at most
(PRIORITY_MAX - PRIORITY_MIN + 1) x AGING_S of waiting before nothing outranks it.

Where it is used: the torch engine's scheduler (admission, preemption, the TTFT plan), and `PriorityLock`,
which serialises the engines that run one request at a time (llama.cpp): their queue is ordered by the same
rank instead of by whichever thread the OS wakes first.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Request.priority, as vLLM's API defines it: lower runs first, default 0.  Bounded so that aging lifts the
# lowest priority above the highest in a bounded time: 201 levels x AGING_S = 1005 s at the very worst.
PRIORITY_MIN, PRIORITY_MAX = -100, 100
API_PRIORITY = 0  # the API's default (vLLM's)
INTERACTIVE_PRIORITY = -1  # the chat app's own requests and `hearth run`: ahead of API traffic by default

AGING_S = 5.0  # seconds of waiting that lift a request one priority level


def effective_priority(priority: int, waited_s: float, aging_s: float = AGING_S) -> int:
    """`priority` lifted one level per `aging_s` seconds waited (lower runs first)."""
    return priority - int(max(waited_s, 0.0) // aging_s) if aging_s > 0 else priority


class PriorityLock:
    """A mutex whose waiters get it in rank order: (effective priority, arrival).  `with lock:` takes it at the
    API's default priority; `with lock.hold(priority):` at a given one.  Not reentrant; any thread may release
    (a generator holding it can be closed from another thread, as with threading.Lock)."""

    def __init__(self, aging_s: float = AGING_S) -> None:
        self.aging_s = aging_s
        self._cv = threading.Condition()
        self._held = False
        self._waiting: dict[int, tuple[int, float]] = {}  # ticket -> (priority, arrival perf_counter)
        self._tickets = itertools.count()

    def _rank(self, ticket: int, now: float) -> tuple[int, float, int]:
        priority, arrived = self._waiting[ticket]
        return (effective_priority(priority, now - arrived, self.aging_s), arrived, ticket)

    def acquire(self, priority: int = API_PRIORITY, arrived: float | None = None) -> None:
        """Wait for the turn at `priority`; `arrived` (a perf_counter time) ranks it as if it had queued then: a
        request that gave its turn away keeps its place among its equals and the aging it earned."""
        with self._cv:
            self._wait_turn(priority, arrived)

    def yield_turn(self, priority: int, arrived: float) -> None:
        """The holder gives the turn to the best-ranked waiter and waits for it again at (priority, arrived), in one
        step, so no later arrival of its rank slips in between (llama.cpp's preemption: backends/llama_cpp).  The
        caller passes as `arrived` now minus the time it has waited so far, so that it is aged by its waiting as
        the waiter it yields to is, not by the time it ran."""
        with self._cv:
            assert self._held, "yield_turn of an unlocked PriorityLock"
            self._held = False
            self._cv.notify_all()
            self._wait_turn(priority, arrived)

    def outranked(self, priority: int) -> bool:
        """Whether a waiter's own priority is strictly better (lower) than `priority`.  Aging is left out on
        purpose: it orders the queue, but a request lifted by waiting preempts nobody, so two requests of one
        priority never take turns back and forth."""
        with self._cv:
            return any(p < priority for p, _ in self._waiting.values())

    def _wait_turn(self, priority: int, arrived: float | None) -> None:
        ticket = next(self._tickets)
        self._waiting[ticket] = (priority, time.perf_counter() if arrived is None else arrived)
        try:
            while True:
                if not self._held:
                    now = time.perf_counter()
                    if min(self._waiting, key=lambda t: self._rank(t, now)) == ticket:
                        self._held = True
                        return
                # aging changes ranks with time: look again now and then even if nobody releases
                self._cv.wait(timeout=self.aging_s if self._held else 0.05)
        finally:
            del self._waiting[ticket]
            self._cv.notify_all()  # the next best waiter may now be first

    def release(self) -> None:
        with self._cv:
            assert self._held, "release of an unlocked PriorityLock"
            self._held = False
            self._cv.notify_all()

    def locked(self) -> bool:
        return self._held

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @contextmanager
    def hold(self, priority: int = API_PRIORITY, arrived: float | None = None) -> Iterator[None]:
        self.acquire(priority, arrived)
        try:
            yield
        finally:
            self.release()

    def __enter__(self) -> PriorityLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
