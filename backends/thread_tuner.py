"""How many CPU threads an engine's steps use: chosen by timing the steps themselves (issue 24 item 4).  Both
engines use it on CPU: the torch engine around each forward (model_runner.py), llama.cpp around each decoded
token (backends/llama_cpp/threads.py).

Why a tuner and not a number. torch's CPU ops run on an OpenMP team (ggml's on its own, which spins alike) whose
threads meet at the end of every op (~600 ops in a starter-model decode step) and spin while they wait for each
other.  When another process takes one of the cores, the team's thread that shares a core with it waits for its time
slice at every op while the other one spins: measured on the 2-core Xeon while other jobs kept the load at ~10, a
starter decode step took 0.9-1.2 s with 2 threads and 75-140 ms with one; on a quiet machine 2 threads are the
faster.  No count suits every moment, and the load changes while the engine runs, so the tuner measures instead of
guessing:

- It times decode-only steps (`key`: the number of rows; a step with prompt tokens is never timed, its size
  varies too much) and keeps the last `window` times at the current count.  The first `warmup` steps of each
  key are not kept: they pay one-time costs (the torch engine's first decode step checks its scripted loop
  against the eager one, the script's next call optimizes it: 58 and 21 ms against 8.4 on the starter), and a
  window that held them made a 1-thread trial "win" on a quiet 2-core machine (11 ms steps beat the polluted
  14.6 ms median), so the first request of a run decoded at 1 thread: 85 tok/s instead of 118.
- Every `interval` it runs a trial: the next decode steps with the same key at a neighbouring count (one
  fewer on 2 cores; c ± max(1, c // 4) on larger machines).  The trial count wins when its median step is at
  least `margin` faster than the window's median; otherwise the tuner goes back and doubles the interval (up to
  `max_interval_s`), so a machine whose best count does not move pays one trial step every few seconds.  A
  trial step slower than twice the window's median ends the trial at once (a collapsing count costs one step).
- More threads are tried only while the machine had spare CPU since the last trial (`idle_cores`, from the
  system's idle time): a core another process keeps busy is not worth a trial, and when it frees up the
  next trial finds it.
- When the current count's steps suddenly take `distress` times the best median it has seen for that key (a
  process just took a core), the next step starts a trial at once.
- It starts where the machine is (`start_at`): the cores other processes left free while the model loaded
  (SpareCores).  Starting at every core and waiting for the trials cost the first steps on a busy machine: with
  one core kept busy, a 2-thread step of the starter took ~1 s, and a prompt chunk (never timed) as much again.

Pure Python: the clock, the idle measure and the call that sets the count are given, so tests drive it with
fake times; the model runner passes torch.set_num_threads.  Changing the count changes which thread computes
which part of an op, never the op: outputs stay within one rounding (tests/greedy_agreement.py's promise).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil


@dataclass
class _Trial:
    threads: int  # the count under trial
    key: int  # the step shape it is measured on
    samples: list[float] = field(default_factory=list)
    other_steps: int = 0  # steps of other shapes that ran during the trial


class ThreadTuner:
    """ThreadTuner(max_threads, set_threads): call `before_step(key)` and `after_step(key, seconds)` around
    every step (key None for steps that are not decode-only); `threads` is the count in use."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        idle_cores: Callable[[], float | None] | None = None,
        window: int = 4,
        trial_steps: int = 3,
        warmup: int = 2,
        margin: float = 0.05,
        distress: float = 1.5,
        min_interval_s: float = 0.5,
        max_interval_s: float = 8.0,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, got {max_threads}")
        self.max_threads = max_threads
        self.threads = max_threads
        self.switches = 0  # times a trial won and the count changed
        self._set = set_threads
        self._clock = clock
        self._idle = idle_cores
        self._window = window
        self._trial_steps = trial_steps
        self._warmup = warmup
        self._warm: dict[int, int] = {}  # key -> its steps seen so far, up to `warmup` (those are not kept)
        self._margin = margin
        self._distress = distress
        self._min_interval = min_interval_s
        self._max_interval = max_interval_s
        self._interval = min_interval_s
        self._next_trial_at = clock() + min_interval_s
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)  # (key, seconds) at the current count
        self._best: dict[int, float] = {}  # key -> lowest window median at the current count
        self._trial: _Trial | None = None
        self._up_next = False  # alternate the direction of trials where both exist
        set_threads(self.threads)

    def start_at(self, threads: int) -> None:
        """Run with `threads` (clamped to 1..max_threads) from the first step: the load's SpareCores figure.
        Trials still move it either way afterwards."""
        self.threads = max(1, min(self.max_threads, threads))
        self._set(self.threads)

    def describe(self) -> dict[str, object]:
        """What both engines' describe() say about an adaptive count (hearth bench reads cpu_threads)."""
        return {
            "cpu_threads": self.threads,  # an int read from another thread: always a whole value
            "cpu_threads_policy": f"adaptive (1 to {self.max_threads})",
            "cpu_thread_switches": self.switches,
        }

    # -- the two calls around a step ---------------------------------------------------------------------
    def before_step(self, key: int | None) -> None:
        if self._trial is not None or key is None or self._clock() < self._next_trial_at:
            return
        if len(self._times(key)) < self._window:
            return  # no baseline for this shape yet
        alternative = self._alternative()
        if alternative is None:
            self._reschedule(won=False)
            return
        self._trial = _Trial(alternative, key)
        self._set(alternative)

    def after_step(self, key: int | None, seconds: float) -> None:
        trial = self._trial
        if trial is None:
            if key is not None:
                self._record(key, seconds)
            return
        if key != trial.key:
            trial.other_steps += 1
            if trial.other_steps > 2 * self._trial_steps:  # the shape moved on: no verdict, try again soon
                self._end_trial(won=False, backoff=False)
            return
        trial.samples.append(seconds)
        baseline = statistics.median(self._times(key))
        if seconds > 2 * baseline:
            self._end_trial(won=False)
        elif len(trial.samples) >= self._trial_steps:
            self._end_trial(won=statistics.median(trial.samples) < baseline * (1 - self._margin))

    # -- internals -------------------------------------------------------------------------------------
    def _times(self, key: int) -> list[float]:
        return [s for k, s in self._recent if k == key]

    def _record(self, key: int, seconds: float) -> None:
        seen = self._warm.get(key, 0)
        if seen < self._warmup:
            self._warm[key] = seen + 1
            return
        self._recent.append((key, seconds))
        times = self._times(key)
        if len(times) < self._window:
            return
        median = statistics.median(times)
        best = self._best.get(key)
        if best is None or median < best:
            self._best[key] = median
        elif median > self._distress * best and self._trial is None:
            self._next_trial_at = self._clock()  # something took the cores: look for a better count now
            self._interval = self._min_interval
            self._best[key] = median  # the new normal, until a trial or a quieter window says otherwise

    def _alternative(self) -> int | None:
        step = max(1, self.threads // 4)
        down = self.threads - step if self.threads > 1 else None
        up = min(self.max_threads, self.threads + step) if self.threads < self.max_threads else None
        if up is not None and self._idle is not None:
            idle = self._idle()
            if idle is not None and idle < 0.5 * step:
                up = None  # other processes keep the cores we would add busy
        if up is not None and down is not None:
            self._up_next = not self._up_next
            return up if self._up_next else down
        return up if up is not None else down

    def _end_trial(self, won: bool, backoff: bool = True) -> None:
        trial = self._trial
        assert trial is not None
        self._trial = None
        if won:
            self.threads = trial.threads
            self.switches += 1
            self._recent.clear()
            self._recent.extend((trial.key, s) for s in trial.samples)
            self._best = {}
        else:
            self._set(self.threads)
        self._reschedule(won=won or not backoff)

    def _reschedule(self, won: bool) -> None:
        self._interval = self._min_interval if won else min(2 * self._interval, self._max_interval)
        self._next_trial_at = self._clock() + self._interval


class IdleCores:
    """Cores the whole machine left idle since the last call, from psutil.cpu_times() (idle + iowait time over
    wall time); None on the first call or where psutil cannot tell."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[float, float] | None = None

    def __call__(self) -> float | None:
        try:
            times = psutil.cpu_times()
        except Exception:  # noqa: BLE001 - no figure: the tuner then tries every count
            return None
        idle = times.idle + getattr(times, "iowait", 0.0)
        now = self._clock()
        last, self._last = self._last, (now, idle)
        if last is None or now <= last[0]:
            return None
        return (idle - last[1]) / (now - last[0])
