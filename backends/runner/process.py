"""One runner process as hearth sees it: the child it started, its socket, the thread that reads its messages
and the watchdog that kills it when its heartbeat stops.  RunnerBackend (backends/runner/client.py) owns these and
decides what a death means; this module only starts, talks to, watches and ends one process.

The owner provides: `new_log_path()`, `options.verbose`, `hang_timeout_s`, `on_message(process, message)` (from
the reader thread) and `on_death(process)` (once, from the reader thread, when the socket ends).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import Future
from typing import Any

from backends.runner import protocol as p
from backends.runner.ladder import RunnerConfig
from backends.runner.prestart import Prestarted, spawn
from backends.runner.resident import Attached, process_alive, wait_gone

CLOSE_TIMEOUT_S = 10.0  # a runner that does not exit this long after Close is killed
LINGER_TIMEOUT_S = 5.0  # a runner that does not take Linger this long is stopped instead
# signals that end a process from outside (a person, a supervisor, a shutdown), never by its own fault
_OUTSIDE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (/proc/vmstat oom_kill, Linux 4.13+; it
    counts cgroup OOM kills too), or None where that cannot be read."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (SIGSTOP, SIGTSTP: state T in /proc/PID/stat) or traced."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class ResidentProcess:
    """The Popen-like handle of a resident runner another command started (backends/runner/resident.py): not
    this process's child, so its exit status cannot be known (wait() gives None)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._gone = False  # seen gone: never signal that pid again (it may be another process's by now)

    def poll(self) -> int | None:
        if self._gone or not process_alive(self.pid):
            self._gone = True
            return 0
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        if not (self._gone or wait_gone(self.pid, timeout)):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        self._gone = True
        return None

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass


class RunnerProcess:
    """One runner process: its socket, its reader thread and its watchdog."""

    def __init__(
        self,
        owner: Any,
        config: RunnerConfig,
        prestarted: Prestarted | None = None,
        attached: Attached | None = None,
    ) -> None:
        self.owner = owner
        self.config = config
        self.outcome: queue.SimpleQueue = queue.SimpleQueue()  # Loaded | LoadFailed | Crash (streams.py)
        self.calls: dict[int, Future] = {}
        self.loaded = False
        self.dead = False  # set (under the owner's lock) as soon as its socket ended
        self.hung = False
        self.hung_stopped = False  # the watchdog found it stopped (SIGSTOP from outside), not busy or deadlocked
        self.oom_kills_at_start = oom_kills()
        self.closing = False
        self.lingering = False  # left loaded for the next command (linger): its end is not a death
        self.resident = attached is not None  # a lingering runner of an earlier command, taken over
        self.lingered = threading.Event()
        self.closed = threading.Event()
        self.last_seen = time.monotonic()
        self.last_sent = "start"
        self._send_lock = threading.Lock()
        self.proc: Any
        if attached is not None:  # a resident runner (backends/runner/resident.py), its handshake done
            self.proc, parent, self.log_path = ResidentProcess(attached.pid), attached.sock, attached.log_path
        elif prestarted is not None:  # started before the model was planned (app/loading.open_backend)
            self.proc, parent, self.log_path = prestarted.adopt()
        else:
            self.log_path = owner.new_log_path()
            self.proc, parent = spawn(self.log_path, owner.options.verbose)
        self.pid = self.proc.pid
        self.channel = p.Channel(parent, p.FromRunner)
        threading.Thread(target=self._read, name=f"runner-{self.pid}-reader", daemon=True).start()
        threading.Thread(target=self._watch, name=f"runner-{self.pid}-watchdog", daemon=True).start()

    def send(self, message: p.ToRunner, what: str) -> None:
        with self._send_lock:
            self.last_sent = what
            try:
                self.channel.send(message)
            except OSError:
                pass  # the runner is gone: the reader sees the end of the socket and reports it

    def _read(self) -> None:
        while True:
            try:
                message = self.channel.recv()
            except (OSError, p.ProtocolError):
                message = None
            if message is None:
                break
            self.last_seen = time.monotonic()
            self.owner.on_message(self, message)
        self.owner.on_death(self)

    def _watch(self) -> None:
        timeout = self.owner.hang_timeout_s
        while self.proc.poll() is None and not self.closed.is_set():
            time.sleep(min(0.25, timeout / 4))
            if time.monotonic() - self.last_seen > timeout and self.proc.poll() is None:
                self.hung = True
                self.hung_stopped = stopped(self.pid)
                self.kill()
                return

    def stop(self, timeout_s: float) -> None:
        """Ask the runner to close (it frees its memory by exiting); kill it if it has not exited in timeout_s."""
        self.closing = True
        self.send(p.Close(), "close")
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self.closed.set()
        self.kill()  # ends the reader thread

    def linger(self, seconds: float | None, path: str, model: str, timeout_s: float) -> bool:
        """Leave the runner loaded for the next command (backends/runner/resident.py) and let go of it; False
        when it did not take the Linger message within timeout_s (then stop it)."""
        self.lingering = True
        self.send(p.Linger(seconds, path, str(self.log_path), model), "linger")
        if not self.lingered.wait(timeout_s):
            self.lingering = False  # the caller stops it
            return False
        self.closed.set()  # the watchdog stops
        try:
            self.channel.sock.close()
        except OSError:
            pass
        return True

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.channel.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def exit_cause(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.wait()
        if self.hung:
            return f"stopped answering for {self.owner.hang_timeout_s:g} s and was killed"
        if rc is None:
            return "ended (a resident runner: its exit status is in its log)"
        if rc < 0:
            try:
                sig = signal.Signals(-rc)
                return f"was killed by {sig.name} ({signal.strsignal(sig) or sig.name})"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with status {rc}" if rc else "exited"

    def killed_from_outside(self) -> bool:
        """Whether the runner's end (exit_cause has waited for it) came from outside rather than from its
        configuration: frozen by a SIGSTOP (stopped when the watchdog gave up on it), ended by SIGTERM, SIGINT or
        SIGHUP, or by a SIGKILL that was not the OOM killer's (the kernel's OOM count did not move; where it
        cannot be read, a SIGKILL counts as a crash).  A SIGSEGV or an abort is the configuration's, whoever sent
        it: a native crash and a signal look alike."""
        if self.hung:
            return self.hung_stopped
        rc = getattr(self.proc, "returncode", None)
        if rc is None or rc >= 0:
            return False
        if -rc == signal.SIGKILL:
            now = oom_kills()
            return now is not None and self.oom_kills_at_start is not None and now == self.oom_kills_at_start
        return -rc in _OUTSIDE_SIGNALS

    def activity(self, streams: list[Any]) -> str:
        if not self.loaded:
            return "while loading the model"
        if streams:
            first = streams[0]
            others = len(streams) - 1
            more = f" and {others} other request{'s' if others > 1 else ''}" if others else ""
            return f"while generating {first.request.request_id} ({first.tokens} tokens in){more}"
        if self.calls:
            return f"in {self.last_sent}"
        return f"while idle (last call: {self.last_sent})"
