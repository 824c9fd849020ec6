"""PriorityLock: the turns of a backend that serves one request at a time (llama.cpp) go by priority, then
arrival, with aging; any thread may release it."""

from __future__ import annotations

import threading
import time

from backends.priority import PriorityLock, effective_priority


def test_effective_priority_lifts_whole_levels() -> None:
    assert effective_priority(3, 0.0, 5.0) == 3
    assert effective_priority(3, 4.99, 5.0) == 3
    assert effective_priority(3, 5.0, 5.0) == 2
    assert effective_priority(3, 26.0, 5.0) == -2
    assert effective_priority(3, 100.0, 0.0) == 3  # aging off


def _queue_up(
    lock: PriorityLock, priorities: list[int], order: list[int] | None = None
) -> tuple[list[int], list[threading.Thread]]:
    order = [] if order is None else order
    waiting = lock.num_waiting

    def take(p: int) -> None:
        with lock.hold(p):
            order.append(p)

    threads = []
    for p in priorities:
        t = threading.Thread(target=take, args=(p,))
        t.start()
        threads.append(t)
        while lock.num_waiting < waiting + len(threads):
            time.sleep(0.001)
    return order, threads


def test_waiters_get_the_lock_by_priority_then_arrival() -> None:
    lock = PriorityLock()
    lock.acquire()  # a request runs
    order, threads = _queue_up(lock, [5, 0, -3, 0, 2])
    lock.release()
    for t in threads:
        t.join(10)
    assert order == [-3, 0, 0, 2, 5]
    assert not lock.locked() and lock.num_waiting == 0


def test_a_long_wait_lifts_a_low_priority_past_newer_better_ones() -> None:
    lock = PriorityLock(aging_s=0.05)
    lock.acquire()
    order, first = _queue_up(lock, [3])
    time.sleep(0.3)  # waited 6 x aging_s: 3 - 6 = -3
    _, later = _queue_up(lock, [-2], order)
    assert lock.num_waiting == 2
    lock.release()
    for t in first + later:
        t.join(10)
    assert order == [3, -2]  # without aging -2 would go first


def test_released_from_another_thread() -> None:
    lock = PriorityLock()
    lock.acquire()
    threading.Thread(target=lock.release).start()
    lock.acquire()  # would hang if only the owner could release
    lock.release()


def test_outranked_only_by_a_strictly_better_own_priority() -> None:
    lock = PriorityLock(aging_s=0.05)
    lock.acquire()  # a request at priority 0 runs
    order, threads = _queue_up(lock, [0])
    time.sleep(0.2)  # the waiter's rank is aged to -4, but aging preempts nobody
    assert not lock.outranked(0)
    _, better = _queue_up(lock, [-1], order)
    assert lock.outranked(0) and not lock.outranked(-1)
    lock.release()
    for t in threads + better:
        t.join(10)


def test_yield_turn_lets_the_better_waiter_run_and_keeps_the_yielders_place() -> None:
    """The holder at priority 0 yields to -5; a priority-0 request that arrived after the holder must not run before
    the holder resumes (the holder keeps its arrival)."""
    lock = PriorityLock()
    arrived = time.perf_counter()
    lock.acquire(0, arrived)
    order, threads = _queue_up(lock, [0, -5])  # a later 0, then a better -5
    lock.yield_turn(0, arrived)  # returns when the turn is ours again
    order.append(99)  # the yielder, resumed
    lock.release()
    for t in threads:
        t.join(10)
    assert order == [-5, 99, 0]
    assert not lock.locked() and lock.num_waiting == 0
