"""One call in a runner process of its own, with no model loaded: `hearth doctor`'s kernel report.

The kernel self-check imports torch and Triton and, on a machine without a GPU, must set TRITON_INTERPRET=1
before any kernel is defined: so it runs in a fresh runner (backends/runner/child.py), never in hearth's own
process, and comes back typed (backends/kernel_report.py).  A crash or a hang of that runner is a
RunnerCrashedError naming the signal and the runner log, as for a model's runner.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from backends.api import LoadOptions
from backends.errors import RunnerCrashedError
from backends.kernel_report import KernelReport
from backends.modelspec import ModelSpec
from backends.runner import protocol as p
from backends.runner.client import hang_timeout_from_env
from backends.runner.ladder import RunnerConfig
from backends.runner.process import CLOSE_TIMEOUT_S, RunnerProcess


class _OneCall:
    """The owner RunnerProcess expects (see process.py), for a runner that answers one call."""

    def __init__(self, backend: str, log_dir: Path) -> None:
        self.options = LoadOptions()  # only .verbose is read: the runner's output goes to its log
        self.hang_timeout_s = hang_timeout_from_env()
        self.log_dir = log_dir
        self.reply: Future = Future()
        self.what = f"the {backend} kernel report"
        self._ids = itertools.count()

    def new_log_path(self) -> Path:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return self.log_dir / f"runner-{os.getpid()}-{stamp}-oneshot-{next(self._ids)}.log"

    def on_message(self, runner: RunnerProcess, m: p.FromRunner) -> None:
        if isinstance(m, (p.KernelReportReply, p.CallFailed)) and not self.reply.done():
            self.reply.set_result(m)
        elif isinstance(m, p.Closed):
            runner.closed.set()

    def on_death(self, runner: RunnerProcess) -> None:
        if runner.closing:
            runner.proc.wait()
            return
        if not self.reply.done():
            self.reply.set_exception(
                RunnerCrashedError(
                    f"the runner (pid {runner.pid}) {runner.exit_cause()} during {self.what}",
                    f"the runner log is {runner.log_path}",
                )
            )


def kernel_report(
    spec: ModelSpec, backend: str, record: str | os.PathLike[str], check_now: bool, log_dir: Any = None
) -> KernelReport:
    """`backend`'s kernel report for `spec` (registry BackendInfo.kernel_report), from a runner of its own:
    the check of every kernel now when `check_now`, and every device's recorded table."""
    owner = _OneCall(backend, Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "hearth-runners")
    runner = RunnerProcess(owner, RunnerConfig(backend, owner.options))
    try:
        runner.send(p.KernelReportCall(0, backend, spec, str(record), check_now), "kernel_report()")
        reply = owner.reply.result()
    finally:
        runner.stop(CLOSE_TIMEOUT_S)
    if isinstance(reply, p.CallFailed):
        p.raise_error(reply.error)
    return reply.report
