"""How many threads llama.cpp computes with: the count asked for, or fewer while other processes keep cores busy.

ggml's thread team spins at a barrier after every op; a team with more threads than free cores waits for a time
slice at each one.  Measured on the 2-core Xeon with one core kept busy by a spinning process: the starter
decoded 0.4 tok/s at 2 threads (`hearth bench --busy-cores 1`; 80 tok/s quiet), where one thread keeps most of
its quiet speed.  Unless the user fixed the count (--threads N), the backend starts from the cores other
processes left free while it loaded (hwprobe/spare_cores.py) and then times each decoded token through the same
ThreadTuner as the torch engine (backends/thread_tuner.py), which moves the count as other processes come and go.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from backends.thread_tuner import IdleCores, ThreadTuner

T = TypeVar("T")


def threads_to_use(asked: int, adaptive: bool, spare: float | None) -> tuple[int, str | None]:
    """(threads, note): `asked` unless the count is adaptive and fewer cores were spare (rounded, at least one);
    the note says why when it differs."""
    if not adaptive or spare is None:
        return asked, None
    free = max(1, round(spare))
    if free >= asked:
        return asked, None
    return free, (
        f"threads {free} of {asked} at load: other processes kept {asked - spare:.1f} cores busy while the model "
        "loaded (a thread team larger than the free cores stalls at every op; --threads N fixes the count)"
    )


class LlamaThreads:
    """The thread count of one llama.cpp context: fixed, or tuned by timing decoded tokens.  Every method runs on
    the backend's llama.cpp thread (one_thread.py), between llama_decode calls."""

    def __init__(self, llm: Any, asked: int, adaptive: bool, start: int) -> None:
        self._llm = llm
        self.tuner: ThreadTuner | None = None
        if adaptive:  # a fixed count is the one the context was made with: nothing to set
            self.tuner = ThreadTuner(asked, self._set, idle_cores=IdleCores())
            self.tuner.start_at(start)

    @property
    def threads(self) -> int:
        return self.tuner.threads if self.tuner is not None else int(self._llm.n_threads)

    def _set(self, n: int) -> None:
        llm = self._llm
        if llm.n_threads == n and llm.n_threads_batch == n:
            return  # the tuner sets its first count twice (at construction and start_at)
        llm._ctx.set_n_threads(n, n)
        llm.n_threads = llm.n_threads_batch = n  # what llama-cpp-python reports and copies into a reload
        llm.context_params.n_threads = llm.context_params.n_threads_batch = n

    def step(self, decode: bool, fn: Callable[[], T]) -> T:
        """fn() (one llama_decode and its sampling), timed for the tuner when it decodes one token (`decode`);
        prompt evaluation is never timed (its size varies too much)."""
        tuner = self.tuner
        if tuner is None:
            return fn()
        key = 1 if decode else None
        tuner.before_step(key)
        t0 = time.perf_counter()
        out = fn()
        tuner.after_step(key, time.perf_counter() - t0)
        return out
