"""`hearth run` leaves its model loaded for --keep-alive (backends/runner/resident.py): the next run with the same
model and plan answers from that runner (no new engine process, no load), `hearth ps` lists it, `hearth stop`
ends it, and --keep-alive 0 leaves nothing behind.  The torch engine on the starter, as a person runs it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="resident runners need SO_PEERCRED"),
]


def hearth(*args: str, keep_alive: str = "60s") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HEARTH_KEEP_ALIVE": keep_alive},
    )


def _gone(pid: int) -> bool:
    """Exited: no process, or a zombie nobody reaped yet (an orphaned runner's new parent may never reap it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _listed() -> list[dict]:
    p = hearth("ps", "--json")
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def _runner_pid(stderr: str) -> tuple[int, bool]:
    """(runner pid, taken over from an earlier command) from --verbose's description line."""
    line = next(x for x in stderr.splitlines() if "runner_pid=" in x)
    m = re.search(r"runner_pid=(\d+)", line)
    assert m, line
    return int(m.group(1)), "runner_reused=True" in line


def test_run_twice_answers_from_the_runner_the_first_left_loaded(starter_path) -> None:
    args = ("run", "--backend", "torch", "--temperature", "0", "--max-tokens", "8", "--verbose")
    first = hearth(*args, "What is the capital of France?")
    assert first.returncode == 0, first.stderr
    pid, reused = _runner_pid(first.stderr)
    assert not reused
    (listed,) = _listed()
    assert listed["pid"] == pid and listed["backend"] == "torch" and listed["model"] == "smollm2-135m-instruct"
    assert listed["rss_bytes"] > 0 and 30 < listed["until"] - time.time() <= 60

    second = hearth(*args, "What is the capital of France?")
    assert second.returncode == 0, second.stderr
    assert _runner_pid(second.stderr) == (pid, True)
    assert second.stdout == first.stdout  # the same model and plan: the same greedy reply

    llama = ("run", "--backend", "llama.cpp", "--temperature", "0", "--max-tokens", "4", "--verbose")
    other = hearth(*llama, "hi")  # another load (engine, plan): that runner is ended first, then one loads
    assert other.returncode == 0, other.stderr
    new, reused = _runner_pid(other.stderr)
    assert new != pid and not reused and _gone(pid)

    stop = hearth("stop", "smollm2-135m-instruct")
    assert stop.returncode == 0 and f"pid {new}" in stop.stdout, stop.stderr
    assert _listed() == [] and _gone(new)

    none = hearth(*llama, "hi", keep_alive="0")
    assert none.returncode == 0, none.stderr
    assert _listed() == [] and _gone(_runner_pid(none.stderr)[0])
    assert hearth("stop").stdout.strip() == "no model was left loaded"
