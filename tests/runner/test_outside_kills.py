"""backends/runner/process.py's call on a runner's end: from outside (SIGSTOP, SIGTERM, SIGINT, SIGHUP, a SIGKILL
that was no OOM kill), or the configuration's (a native crash, an OOM kill, an exit)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from backends.runner import process
from backends.runner.process import RunnerProcess


def _ended(returncode: int | None, *, hung: bool = False, hung_stopped: bool = False, oom_at_start: int | None = 7):
    runner = object.__new__(RunnerProcess)  # the classification reads only these, after exit_cause has waited
    runner.proc = SimpleNamespace(returncode=returncode)
    runner.hung, runner.hung_stopped, runner.oom_kills_at_start = hung, hung_stopped, oom_at_start
    return runner


@pytest.mark.parametrize(
    ("returncode", "oom_now", "outside"),
    [
        (-signal.SIGKILL, 7, True),  # killed, and the OOM killer killed nobody meanwhile
        (-signal.SIGKILL, 8, False),  # the OOM killer's: too much memory is the configuration's
        (-signal.SIGKILL, None, False),  # cannot tell: a crash
        (-signal.SIGTERM, 7, True),
        (-signal.SIGINT, 7, True),
        (-signal.SIGHUP, 7, True),
        (-signal.SIGSEGV, 7, False),  # a native crash and a sent SIGSEGV look alike: the configuration's
        (-signal.SIGABRT, 7, False),
        (1, 7, False),
        (0, 7, False),
        (None, 7, False),  # a resident runner: no exit status
    ],
)
def test_an_end_is_from_outside_only_when_nothing_says_it_was_the_runners(monkeypatch, returncode, oom_now, outside):
    monkeypatch.setattr(process, "oom_kills", lambda: oom_now)
    assert _ended(returncode).killed_from_outside() is outside


def test_a_hang_is_from_outside_when_the_runner_was_stopped() -> None:
    assert _ended(-signal.SIGKILL, hung=True, hung_stopped=True).killed_from_outside()
    assert not _ended(-signal.SIGKILL, hung=True, hung_stopped=False).killed_from_outside()  # busy or deadlocked


def test_stopped_reads_the_process_state() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not process.stopped(child.pid)
        child.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not process.stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.stopped(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process.stopped(child.pid)  # gone
