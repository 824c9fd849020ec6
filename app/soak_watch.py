"""The watch side of `hearth bench --soak` (issue 43): chaos against the engine runners, and samples of what the
server and its runners hold, reduced to the figures the soak report gives.

- `runner_pids` finds the server's runners (descendants running `backends.runner.child`);
- `Chaos` is a thread that now and then SIGKILLs, SIGSEGVs or SIGSTOPs one runner (and SIGCONTs a stopped one
  after `stop_s`, past the server's heartbeat timeout, so the server has declared it frozen by then);
- `Sampler` is a thread that records the server's and the runners' RSS and open descriptors every few seconds;
- `rss_slope_mib_per_min`, `fd_growth` and `runner_restarts` reduce the samples; `left_processes` lists what is
  still alive (or still listening) after the server stopped.

Processes come and go under our feet (a runner may exit between listing it and reading it): every read here
counts what it can and skips a process that vanished, was denied or is a zombie; the threads never raise.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

RUNNER_MODULE = "backends.runner.child"  # what a runner's command line runs (backends/runner/prestart.py)
CHAOS_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGSTOP")  # picked with equal odds
_MIB = 1024 * 1024


def runner_pids(server_pid: int) -> list[int]:
    """pids of the server's runner processes (descendants whose cmdline runs backends.runner.child), sorted.
    A zombie (dead, not yet reaped) is not a runner; a server that is gone has none."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and any(RUNNER_MODULE in arg for arg in child.cmdline()):
                found.append(child.pid)
        except psutil.Error:  # exited, zombie or denied between listing and reading
            continue
    return sorted(found)


def _send(pid: int, signal_name: str) -> bool:
    """Send the signal; False when the pid is gone (or not ours), which is fine here."""
    try:
        os.kill(pid, getattr(signal, signal_name))
    except OSError:  # ProcessLookupError (gone), PermissionError (the pid was reused by someone else's)
        return False
    return True


@dataclass(frozen=True)
class Kill:
    at_s: float  # time.monotonic() when the signal was sent
    pid: int  # the runner that got it
    signal: str  # "SIGKILL" | "SIGSEGV" | "SIGSTOP"


class _Background:
    """A daemon thread running `_run` until `stop()` (which joins it); `_quit` is set to end it."""

    def __init__(self, name: str) -> None:
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._quit.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError


class Chaos(_Background):
    """A thread that, every min_gap_s..max_gap_s (random, from rng), picks one runner of server_pid at random and
    sends SIGKILL, SIGSEGV or SIGSTOP (equally likely); a SIGSTOPped one gets SIGCONT after stop_s (past the
    server's heartbeat timeout, so the server has declared it frozen by then).  `start()`, `stop()` (joins; sends
    SIGCONT to anything it stopped and has not resumed), `kills: list[Kill]`.  Skips a round when no runner exists.

    A runner it stopped and has not resumed yet is not picked again (its fate is the server's: it kills it as
    frozen).  `kills` holds only signals that were delivered (a runner that vanished first is no kill)."""

    def __init__(
        self,
        server_pid: int,
        rng: random.Random,
        *,
        min_gap_s: float = 8.0,
        max_gap_s: float = 20.0,
        stop_s: float = 8.0,
    ) -> None:
        self.server_pid = server_pid
        self.rng = rng
        self.min_gap_s = min_gap_s
        self.max_gap_s = max_gap_s
        self.stop_s = stop_s
        self.kills: list[Kill] = []
        self._stopped: dict[int, float] = {}  # pid -> monotonic time its SIGCONT is due
        super().__init__("soak-chaos")

    def stop(self) -> None:
        super().stop()
        for pid in list(self._stopped):
            _send(pid, "SIGCONT")
        self._stopped.clear()

    def _run(self) -> None:
        next_round = time.monotonic() + self._gap()
        while True:
            now = time.monotonic()
            try:
                self._resume_due(now)
                if now >= next_round:
                    self._round()
                    next_round = now + self._gap()
            except Exception:  # logged, never raised: a dead chaos thread would end the chaos, not the soak
                log.exception("soak chaos round failed")
                next_round = now + self._gap()
            wake = min([next_round, *self._stopped.values()])
            if self._quit.wait(max(0.0, wake - time.monotonic())):
                return

    def _gap(self) -> float:
        return self.rng.uniform(self.min_gap_s, self.max_gap_s)

    def _resume_due(self, now: float) -> None:
        for pid, due in list(self._stopped.items()):
            if now >= due:
                _send(pid, "SIGCONT")
                del self._stopped[pid]

    def _round(self) -> None:
        candidates = [pid for pid in runner_pids(self.server_pid) if pid not in self._stopped]
        if not candidates:
            return
        pid = self.rng.choice(candidates)
        signal_name = self.rng.choice(CHAOS_SIGNALS)
        at_s = time.monotonic()
        if not _send(pid, signal_name):
            return
        self.kills.append(Kill(at_s=at_s, pid=pid, signal=signal_name))
        if signal_name == "SIGSTOP":
            self._stopped[pid] = at_s + self.stop_s


@dataclass(frozen=True)
class Sample:
    at_s: float  # time.monotonic() when it was taken
    server_rss_mib: float  # the server's resident set (0.0 when it could not be read)
    server_fds: int  # the server's open descriptors (0 when it could not be read)
    runners_rss_mib: float  # the runners' resident sets, summed over those that could be read
    runners_fds: int  # the runners' open descriptors, summed likewise
    runner_pids: tuple[int, ...]  # the runners listed at this sample, sorted


def _rss_and_fds(pid: int) -> tuple[float, int] | None:
    """(RSS in MiB, open descriptors) of a process, or None when it vanished, was denied or is a zombie."""
    try:
        proc = psutil.Process(pid)
        return proc.memory_info().rss / _MIB, proc.num_fds()
    except psutil.Error:
        return None


def take_sample(server_pid: int) -> Sample:
    """One Sample of the server and its runners, now."""
    at_s = time.monotonic()
    server = _rss_and_fds(server_pid) or (0.0, 0)
    pids = runner_pids(server_pid)
    runners = [read for read in map(_rss_and_fds, pids) if read is not None]
    return Sample(
        at_s=at_s,
        server_rss_mib=server[0],
        server_fds=server[1],
        runners_rss_mib=sum(rss for rss, _ in runners),
        runners_fds=sum(fds for _, fds in runners),
        runner_pids=tuple(pids),
    )


class Sampler(_Background):
    """A thread sampling the server process and its runners every interval_s (default 2.0) into `samples`;
    start() / stop().  The first sample is taken at start(); stop() joins."""

    def __init__(self, server_pid: int, interval_s: float = 2.0) -> None:
        self.server_pid = server_pid
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        super().__init__("soak-sampler")

    def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            try:
                self.samples.append(take_sample(self.server_pid))
            except Exception:  # logged, never raised: a dead sampler would leave the soak report blank
                log.exception("soak sample failed")
            next_at += self.interval_s  # on a fixed grid: a slow sample does not stretch the interval
            if self._quit.wait(max(0.0, next_at - time.monotonic())):
                return


def _after_warmup(samples: list[Sample], warmup_s: float) -> list[Sample]:
    if not samples:
        return []
    start = samples[0].at_s + warmup_s
    return [s for s in samples if s.at_s >= start]


def rss_slope_mib_per_min(samples: list[Sample], warmup_s: float, runners: bool = False) -> float:
    """Least-squares slope of the server's RSS (or the runners' total) over the samples after warmup_s from the
    first, in MiB per minute; 0.0 with fewer than 3 samples."""
    kept = _after_warmup(samples, warmup_s)
    if len(kept) < 3:
        return 0.0
    xs = [(s.at_s - kept[0].at_s) / 60.0 for s in kept]  # minutes
    ys = [s.runners_rss_mib if runners else s.server_rss_mib for s in kept]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    if var_x == 0.0:  # all at one instant: no slope to speak of
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var_x


def fd_growth(samples: list[Sample], warmup_s: float) -> int:
    """The server's open descriptors at the last sample minus at the first after warmup_s (0 with fewer than 2)."""
    kept = _after_warmup(samples, warmup_s)
    if len(kept) < 2:
        return 0
    return kept[-1].server_fds - kept[0].server_fds


def runner_restarts(samples: list[Sample]) -> int:
    """How many runner pids appeared after the first sample's (each one a start after a crash, a kill or a load),
    counting distinct new pids."""
    if not samples:
        return 0
    first = set(samples[0].runner_pids)
    later = {pid for s in samples[1:] for pid in s.runner_pids}
    return len(later - first)


def _listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive_command(pid: int) -> str | None:
    """The command line of a live process (a zombie is not live), "?" when it lives but is not ours to read, None
    when it is gone."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.NoSuchProcess:  # gone (psutil.ZombieProcess is one too)
        return None
    except psutil.AccessDenied:
        return "?"


def left_processes(pids_seen: Iterable[int], port: int | None = None) -> list[str]:
    """After the server stopped: every pid of `pids_seen` still alive (not a zombie), as "pid cmdline", plus "port N
    still listening" when something still listens on 127.0.0.1:port."""
    left = [f"{pid} {command}" for pid in sorted(set(pids_seen)) if (command := _alive_command(pid)) is not None]
    if port is not None and _listening(port):
        left.append(f"port {port} still listening")
    return left
