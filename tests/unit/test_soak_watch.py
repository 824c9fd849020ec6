"""app/soak_watch.py, the watch side of `hearth bench --soak`: against real processes but no model.  A stand-in
server (a python process) keeps two children whose command line names backends.runner.child (and one that does
not); chaos signals them, the sampler reads them; the reductions run on hand-made samples."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from app.soak_watch import (
    Chaos,
    Sample,
    Sampler,
    fd_growth,
    left_processes,
    rss_slope_mib_per_min,
    runner_pids,
    runner_restarts,
)

# The stand-in server.  The marker is built at run time so that the server's own command line does not name it (a
# forked child, before its exec, would otherwise look like a runner).  "respawn": a runner that dies is replaced,
# as the real server does; either way the dead are reaped (poll) so that they do not linger as zombies.
_SERVER = r"""
import resource, signal, subprocess, sys, time
marker = "backends.runner." + "child"
respawn = sys.argv[1] == "respawn"
def no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the SIGSEGVs leave no core files
def runner():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker], preexec_fn=no_core)
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
kids = [runner(), runner()]
def end(*_):  # SIGTERM: end and reap every child (stopped ones too), so that none is left to init
    for kid in [*kids, other]:
        kid.kill()
        kid.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    kids = [runner() if kid.poll() is not None and respawn else kid for kid in kids]
    time.sleep(0.05)
"""
_STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def _gone(pid: int) -> bool:
    return _status(pid) in ("gone", psutil.STATUS_ZOMBIE)


def _end_tree(proc: subprocess.Popen) -> None:
    """End the stand-in server, which ends and reaps its children on SIGTERM; SIGKILL whatever outlives that."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for member in family:
        if not _gone(member.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.pid, signal.SIGKILL)  # an orphan now: init reaps it


def _start_server(mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, mode])
    try:
        assert _wait_for(lambda: len(runner_pids(proc.pid)) == 2), "the stand-in server never had two runners"
    except BaseException:
        _end_tree(proc)
        raise
    return proc


@pytest.fixture
def server() -> Iterator[subprocess.Popen]:
    """A stand-in server whose runners stay dead once killed."""
    proc = _start_server("once")
    try:
        yield proc
    finally:
        _end_tree(proc)


@pytest.fixture
def respawning_server() -> Iterator[subprocess.Popen]:
    """A stand-in server that replaces a runner that died."""
    proc = _start_server("respawn")
    try:
        yield proc
    finally:
        _end_tree(proc)


def test_runner_pids_finds_the_runners_only(server: subprocess.Popen) -> None:
    children = psutil.Process(server.pid).children()
    assert len(children) == 3  # two runners and one other
    runners = [c.pid for c in children if any("backends.runner.child" in arg for arg in c.cmdline())]
    assert runner_pids(server.pid) == sorted(runners)
    assert server.pid not in runner_pids(server.pid)


def test_runner_pids_of_a_server_that_is_gone_is_empty() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert runner_pids(gone.pid) == []


def test_a_killed_runner_is_no_longer_listed(server: subprocess.Popen) -> None:
    first, second = runner_pids(server.pid)
    os.kill(first, signal.SIGKILL)
    assert _wait_for(lambda: runner_pids(server.pid) == [second])


def _check_resumed(chaos: Chaos, stop_s: float, checked: set[int]) -> None:
    """Every SIGSTOP older than stop_s (and a margin) whose runner got no later signal is no longer stopped."""
    now = time.monotonic()
    for i, kill in enumerate(list(chaos.kills)):
        if kill.signal != "SIGSTOP" or now < kill.at_s + stop_s + 0.5 or i in checked:
            continue
        status = _status(kill.pid)
        hit_again = any(later.pid == kill.pid for later in chaos.kills[i + 1 :])  # read after the status
        if not hit_again:
            assert status not in _STOPPED, f"runner {kill.pid} still stopped {now - kill.at_s:.1f} s after SIGSTOP"
            checked.add(i)


def test_chaos_kills_segfaults_and_stops_then_resumes(respawning_server: subprocess.Popen) -> None:
    stop_s = 0.3
    chaos = Chaos(respawning_server.pid, random.Random(43), min_gap_s=0.2, max_gap_s=0.4, stop_s=stop_s)
    sampler = Sampler(respawning_server.pid, interval_s=0.1)
    checked: set[int] = set()  # SIGSTOPs whose resume was seen
    others = {c.pid for c in psutil.Process(respawning_server.pid).children()} - set(runner_pids(respawning_server.pid))
    sampler.start()
    chaos.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            {"SIGKILL", "SIGSEGV"} <= {k.signal for k in chaos.kills} and checked
        ):
            _check_resumed(chaos, stop_s, checked)
            time.sleep(0.05)
    finally:
        chaos.stop()
        sampler.stop()
    kills = list(chaos.kills)
    assert {k.signal for k in kills} == {"SIGKILL", "SIGSEGV", "SIGSTOP"}, kills
    assert checked, "no SIGSTOPped runner was seen resumed"
    assert not {respawning_server.pid, *others} & {k.pid for k in kills}  # only runners are hit
    for kill in kills:
        if kill.signal in ("SIGKILL", "SIGSEGV"):
            assert _wait_for(lambda pid=kill.pid: _gone(pid), 5.0), f"{kill} did not end runner {kill.pid}"
    for pid in runner_pids(respawning_server.pid):  # stop() resumed whatever was still stopped
        assert _wait_for(lambda pid=pid: _status(pid) not in _STOPPED, 2.0)
    assert runner_restarts(sampler.samples) >= 1  # the server replaced at least one runner the sampler saw


def test_chaos_stop_resumes_what_it_stopped(respawning_server: subprocess.Popen) -> None:
    chaos = Chaos(respawning_server.pid, random.Random(1), min_gap_s=0.1, max_gap_s=0.2, stop_s=60.0)
    chaos.start()
    try:
        assert _wait_for(lambda: any(k.signal == "SIGSTOP" for k in chaos.kills), 20.0), chaos.kills
        stopped = next(k.pid for k in chaos.kills if k.signal == "SIGSTOP")
        assert _wait_for(lambda: _status(stopped) in _STOPPED, 2.0)
    finally:
        chaos.stop()
    assert _wait_for(lambda: _status(stopped) not in _STOPPED, 2.0)


def test_chaos_skips_rounds_without_runners() -> None:
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        chaos = Chaos(lone.pid, random.Random(0), min_gap_s=0.05, max_gap_s=0.1, stop_s=0.1)
        chaos.start()
        time.sleep(0.6)
        chaos.stop()
        assert chaos.kills == []
        assert lone.poll() is None
    finally:
        lone.kill()
        lone.wait()


def test_sampler_reads_the_server_and_its_runners(server: subprocess.Popen) -> None:
    sampler = Sampler(server.pid, interval_s=0.1)
    sampler.start()
    try:
        assert _wait_for(lambda: len(sampler.samples) >= 4, 10.0)
    finally:
        sampler.stop()
    runners = tuple(runner_pids(server.pid))
    fds_now = psutil.Process(server.pid).num_fds()
    for sample in sampler.samples:
        assert sample.server_rss_mib > 1.0  # a python process holds several MiB
        assert 3 <= sample.server_fds <= fds_now + 8
        assert sample.runner_pids == runners
        assert sample.runners_rss_mib > 2.0
        assert sample.runners_fds >= 6
    times = [s.at_s for s in sampler.samples]
    assert times == sorted(times)
    n = len(sampler.samples)
    time.sleep(0.3)
    assert len(sampler.samples) == n  # stop() ended it


def test_sampler_of_a_vanished_server_records_zeros() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sampler = Sampler(gone.pid, interval_s=0.05)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    assert sampler.samples
    assert all(
        (s.server_rss_mib, s.server_fds, s.runners_fds, s.runner_pids) == (0.0, 0, 0, ()) for s in sampler.samples
    )


def _sample(
    at_s: float, rss: float = 100.0, fds: int = 20, runners_rss: float = 0.0, pids: tuple[int, ...] = ()
) -> Sample:
    return Sample(
        at_s=at_s, server_rss_mib=rss, server_fds=fds, runners_rss_mib=runners_rss, runners_fds=0, runner_pids=pids
    )


def test_rss_slope_of_a_linear_series_after_the_warmup() -> None:
    t0 = 1000.0
    warm = [_sample(t0 + t, rss=50.0 + 10.0 * t) for t in range(0, 30, 2)]  # steep start-up, left out
    steady = [
        _sample(t0 + t, rss=300.0 + 5.0 * t / 60.0, runners_rss=900.0 - 2.0 * t / 60.0) for t in range(30, 600, 2)
    ]
    samples = warm + steady
    assert rss_slope_mib_per_min(samples, warmup_s=30.0) == pytest.approx(5.0)
    assert rss_slope_mib_per_min(samples, warmup_s=30.0, runners=True) == pytest.approx(-2.0)
    assert rss_slope_mib_per_min(samples, warmup_s=0.0) > 5.0  # the warm-up would have skewed it


def test_rss_slope_of_a_flat_series_is_zero() -> None:
    flat = [_sample(float(t), rss=123.0, runners_rss=456.0) for t in range(0, 120, 2)]
    assert rss_slope_mib_per_min(flat, warmup_s=10.0) == 0.0
    assert rss_slope_mib_per_min(flat, warmup_s=10.0, runners=True) == 0.0


def test_rss_slope_with_noise_is_near_the_trend() -> None:
    rng = random.Random(5)
    noisy = [_sample(float(t), rss=200.0 + 3.0 * t / 60.0 + rng.uniform(-1.0, 1.0)) for t in range(0, 1800, 2)]
    assert rss_slope_mib_per_min(noisy, warmup_s=0.0) == pytest.approx(3.0, abs=0.05)


def test_rss_slope_needs_three_samples_after_the_warmup() -> None:
    assert rss_slope_mib_per_min([], warmup_s=0.0) == 0.0
    two = [_sample(0.0, rss=1.0), _sample(60.0, rss=100.0)]
    assert rss_slope_mib_per_min(two, warmup_s=0.0) == 0.0
    three_but_warm = [_sample(0.0), _sample(10.0), _sample(60.0, rss=100.0), _sample(120.0, rss=200.0)]
    assert rss_slope_mib_per_min(three_but_warm, warmup_s=30.0) == 0.0
    assert rss_slope_mib_per_min(three_but_warm[1:], warmup_s=0.0) > 0.0
    same_instant = [_sample(5.0, rss=r) for r in (1.0, 2.0, 3.0)]
    assert rss_slope_mib_per_min(same_instant, warmup_s=0.0) == 0.0


def test_fd_growth_after_the_warmup() -> None:
    samples = [_sample(0.0, fds=5), _sample(10.0, fds=40), _sample(20.0, fds=42), _sample(30.0, fds=41)]
    samples.append(_sample(40.0, fds=47))
    assert fd_growth(samples, warmup_s=10.0) == 7  # 47 - 40: the opening 5 is warm-up
    assert fd_growth(samples, warmup_s=0.0) == 42
    assert fd_growth(samples, warmup_s=40.0) == 0  # one sample left
    assert fd_growth([], warmup_s=0.0) == 0
    shrinking = [_sample(0.0, fds=30), _sample(5.0, fds=25)]
    assert fd_growth(shrinking, warmup_s=0.0) == -5


def test_runner_restarts_counts_distinct_new_pids() -> None:
    pid_sets = [(1, 2), (1, 2), (1, 3), (3, 4), (), (3, 4), (5,), (5,)]
    samples = [_sample(float(i), pids=pids) for i, pids in enumerate(pid_sets)]
    assert runner_restarts(samples) == 3  # 3, 4 and 5; 3 and 4 reappearing after a gap count once
    assert runner_restarts(samples[:2]) == 0
    assert runner_restarts([]) == 0
    loading = [_sample(0.0), _sample(1.0, pids=(7,)), _sample(2.0, pids=(7,))]
    assert runner_restarts(loading) == 1  # the first load counts as a start


def test_left_processes_reports_the_living_not_the_dead_nor_zombies() -> None:
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", "left-behind"]
    alive = subprocess.Popen(cmd)
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        done.wait()
        zombie.kill()  # not reaped yet: a zombie is no process left behind
        assert _wait_for(lambda: _status(zombie.pid) == psutil.STATUS_ZOMBIE, 5.0)
        assert _wait_for(lambda: bool(psutil.Process(alive.pid).cmdline()), 5.0)
        assert left_processes([alive.pid, zombie.pid, done.pid, alive.pid]) == [f"{alive.pid} {' '.join(cmd)}"]
        alive.kill()
        alive.wait()
        assert left_processes([alive.pid, zombie.pid, done.pid]) == []
    finally:
        for proc in (alive, zombie, done):
            proc.kill()
            proc.wait()


def test_left_processes_reports_a_port_still_listening() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert left_processes([], port=port) == [f"port {port} still listening"]
    finally:
        listener.close()
    assert left_processes([], port=port) == []
    assert left_processes([]) == []
