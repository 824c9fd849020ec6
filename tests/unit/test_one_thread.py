"""OneThread: every call runs on the same thread, in order, and errors come back to the caller."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.llama_cpp.one_thread import OneThread


def test_calls_from_many_threads_run_on_one_thread_and_errors_come_back() -> None:
    worker = OneThread("one")
    names = set()

    def where(i: int) -> int:
        names.add(threading.current_thread().name)
        return i * 2

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: worker.call(where, i), range(40))) == [i * 2 for i in range(40)]
    assert names == {"one"}
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    assert worker.call(lambda: worker.call(lambda: 7)) == 7  # re-entrant from its own thread
    worker.stop()
    assert not any(t.name == "one" for t in threading.enumerate())
    assert worker.call(lambda: 3) == 3  # a call after stop starts a new thread
    worker.stop()


def test_a_generator_can_be_driven_on_the_thread() -> None:
    worker = OneThread("gen")
    seen = []

    def gen():
        for i in range(3):
            seen.append(threading.current_thread().name)
            yield i

    g, end = gen(), object()
    out = []
    while (x := worker.call(next, g, end)) is not end:
        out.append(x)
    assert out == [0, 1, 2] and set(seen) == {"gen"}
    worker.stop()
