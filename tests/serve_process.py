"""Waiting for a `hearth serve` subprocess that tests start: one loop instead of one per test file."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def wait_healthy(
    proc: subprocess.Popen, url: str, timeout_s: float, log: Path | Callable[[], str], interval_s: float = 0.2
) -> None:
    """Return once `url`/health answers 200.  Fails the test, with the server's output (`log`: its log file, or
    a function giving the text to show), when the process exits first or `timeout_s` passes."""
    why = log.read_text if isinstance(log, Path) else log
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, why()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, why()
        time.sleep(interval_s)
