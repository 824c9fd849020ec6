"""Cores other processes leave free: what an engine's CPU thread count should start from.

An OpenMP or ggml thread team whose threads outnumber the free cores collapses: its threads meet at the end of
every op and the one that shares a core with another process waits a time slice each time.  Measured on the
2-core Xeon with one core kept busy by a spinning process: the starter's torch decode step took ~1 s at 2
threads and ~25 ms at one; llama.cpp decoded 0.4 tok/s at 2 threads.  So an engine measures, over its own load,
how much CPU the other processes used, and starts with the cores they left (backends/thread_tuner.py
then keeps adapting).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil


class SpareCores:
    """Cores that other processes left free since this object was made: the machine's cores less what the
    others used (all cores' busy time less this process's own CPU time, psutil), over wall time.  None where
    too little time passed to tell (`min_seconds`) or psutil cannot say."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, min_seconds: float = 0.1) -> None:
        self._clock = clock
        self._min_seconds = min_seconds
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            times = psutil.cpu_times()
            own = psutil.Process().cpu_times()
        except Exception:  # noqa: BLE001 - no figure: the engine then starts at every core
            return None
        idle = times.idle + getattr(times, "iowait", 0.0)
        return self._clock(), idle, own.user + own.system

    def __call__(self) -> float | None:
        start, now = self._start, self._sample()
        cores = psutil.cpu_count() or 0
        if start is None or now is None or cores < 1:
            return None
        wall = now[0] - start[0]
        if wall < self._min_seconds:
            return None
        others = (cores * wall - (now[1] - start[1]) - (now[2] - start[2])) / wall
        return max(0.0, min(float(cores), cores - others))
