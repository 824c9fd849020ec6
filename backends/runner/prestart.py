"""Start a runner process (`python -m backends.runner.child`): the spawn itself, and a runner started before
hearth knows what it will load (Prestarted).  Standard library only, so that a command can start its runner
before it imports the rest of hearth (app/commands/run.py); RunnerProcess (process.py) uses the same spawn."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


def spawn(log_path: Path, verbose: bool, preload: str | None = None) -> tuple[subprocess.Popen, socket.socket]:
    """Start `python -m backends.runner.child` with its end of a socket pair; returns (process, hearth's end).
    `preload`: a backend the runner imports while it waits for its Load message (child.py)."""
    parent, child = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in sys.path if x and os.path.isdir(x))
    log = None if verbose else open(log_path, "ab")
    cmd = [sys.executable, "-m", "backends.runner.child", "--fd", str(child.fileno())]
    try:
        # A session of its own: Ctrl-C in the terminal reaches hearth, which aborts or closes the runner;
        # the runner never sees a SIGINT meant for the app.
        proc = subprocess.Popen(
            cmd + (["--preload", preload] if preload else []),
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=log or sys.stderr,
            stderr=log or sys.stderr,
            env=env,
            start_new_session=True,
        )
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
        if log is not None:
            log.close()
    return proc, parent


@dataclass
class Prestarted:
    """A runner started before hearth has resolved and planned its model (app/loading.open_backend), so that its
    interpreter start and its engine's imports (`import torch`: ~1 s) overlap hearth's own work; the first
    RunnerProcess of a RunnerBackend adopts it and sends it the Load message.  Until then it only sends
    heartbeats, which wait in the socket.  `discard()` when it is not used: it exits when its socket closes."""

    proc: subprocess.Popen
    sock: socket.socket
    log_path: Path
    verbose: bool
    preload: str | None  # the backend it imports while it waits; None: none (the plan had not chosen one)
    taken: bool = False  # adopted by a RunnerProcess, or discarded

    @classmethod
    def start(cls, log_path: Path, verbose: bool, preload: str | None) -> Prestarted:
        proc, sock = spawn(log_path, verbose, preload)
        return cls(proc, sock, log_path, verbose, preload)

    def adopt(self) -> tuple[subprocess.Popen, socket.socket, Path]:
        """(process, hearth's end of its socket, log path) for the RunnerProcess that takes it over; discard()
        no longer ends it."""
        self.taken = True
        return self.proc, self.sock, self.log_path

    def fits(self, backend: str, verbose: bool) -> bool:
        """Whether a runner for `backend` can be this one (a runner that imported another engine is not)."""
        return self.preload in (None, backend) and self.verbose == verbose

    def discard(self) -> None:
        """End it unless a RunnerProcess adopted it (then that one owns it); safe to call more than once."""
        if self.taken:
            return
        self.taken = True
        try:
            self.sock.close()  # the runner sees the end of its socket and exits (child.py)
        except OSError:
            pass
        # A runner never given a Load holds nothing: it is ended now, not left to finish its `import torch` (~0.7 s
        # of CPU) before it notices its socket closed; a command refused early (a corrupt GGUF) waited for that.
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # a runner that was never used and said nothing leaves no log behind (a command refused after its
        # runner started, such as a bad flag found by the plan, leaves the logs folder as it was)
        try:
            if self.log_path.stat().st_size == 0:
                self.log_path.unlink()
        except OSError:
            pass
