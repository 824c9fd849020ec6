"""The server's slots, handed out by priority: the front door's half of hearth's scheduling by priority.

`slots` generations run at once (max-concurrency for a backend that batches; 1 for one that serialises).  A
request that finds them taken waits; when one frees, the best-ranked waiter gets it: lower `priority` first,
then earlier arrival, a waiter gaining one level per backends.priority.AGING_S seconds waited (the engine's
own rule, so the two never disagree for long and nothing waits forever).

A backend that preempts (both local engines: the torch engine in its batch, llama.cpp by handing its one context
over between tokens) does not make a better request wait behind the slot limit: a request whose priority is
strictly better than that of some running request is let in at once, up to `2 x slots` running, and the engine
preempts the worst one for it.  Without this, a person's chat message behind 16 long batch streams (or one long
llama.cpp stream) would wait for one of them to end, whatever its priority.  A backend that cannot preempt (a remote
server) gets no such overtaking; its queue is ordered only.

Runs on the event loop's thread only (no locks).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

from backends.priority import AGING_S, effective_priority


@dataclass
class _Waiter:
    priority: int
    arrived: float
    order: int
    future: asyncio.Future = field(compare=False)


class Admission:
    def __init__(self, slots: int, preempts: bool, aging_s: float = AGING_S) -> None:
        self.slots = slots
        self.preempts = preempts  # the backend preempts for priority (may run past `slots`, up to 2 x slots)
        self.aging_s = aging_s
        self.running: Counter[int] = Counter()  # priority -> generations holding a slot
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()

    @property
    def num_running(self) -> int:
        return sum(self.running.values())

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    def _may_enter(self, priority: int) -> bool:
        used = self.num_running
        if used < self.slots:
            return True
        worst = max((p for p, n in self.running.items() if n > 0), default=None)
        return self.preempts and used < 2 * self.slots and worst is not None and priority < worst

    def _rank(self, w: _Waiter, now: float) -> tuple[int, float, int]:
        return (effective_priority(w.priority, now - w.arrived, self.aging_s), w.arrived, w.order)

    async def acquire(self, priority: int) -> None:
        """Wait for a slot (in rank order); cancelling the wait gives up the place (or the slot just granted)."""
        if not self._waiters and self._may_enter(priority) or self._outranks_waiters(priority):
            self.running[priority] += 1
            return
        waiter = _Waiter(priority, time.perf_counter(), next(self._order), asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():  # granted as it was cancelled
                self.release(priority)
            raise

    def _outranks_waiters(self, priority: int) -> bool:
        """A newcomer that overtakes the slot limit (see the module docstring) need not queue behind waiters
        that could not: it is strictly better than some running request and than every waiter."""
        if not self._waiters or not self._may_enter(priority) or self.num_running < self.slots:
            return False
        return all(priority < w.priority for w in self._waiters)

    def release(self, priority: int) -> None:
        self.running[priority] -= 1
        if self.running[priority] <= 0:
            del self.running[priority]
        self._wake()

    def _wake(self) -> None:
        now = time.perf_counter()
        while self._waiters:
            best = min(self._waiters, key=lambda w: self._rank(w, now))
            if not self._may_enter(best.priority):
                return
            self._waiters.remove(best)
            self.running[best.priority] += 1
            best.future.set_result(None)
