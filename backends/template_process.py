"""TemplateProcess: the parent side of the render worker (`backends/template_worker.py`).

One worker per hearth process, started at the first render and reused (a render costs one pipe round trip).
Renders go one at a time (a lock); the wall-clock limit counts from the moment the request is written, not
from the wait for the lock or the worker's start.  A worker that is late is killed (SIGKILL: a C-level call
inside the template stops too) and the next render starts a fresh one; so does a worker that died.  Waiting
is select() on the worker's pipe (POSIX: Linux and macOS, where hearth runs).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from backends.errors import TemplateError

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template_worker.py")
_START_TIMEOUT_S = 30.0  # a cold interpreter on a loaded machine; only the first render waits for it

_HINTS = {
    "syntax": "this model file's chat template is broken: use a fixed or another model file",
    "security": "this model file's chat template is unsafe: use another model file",
    "raise": "the model's chat template does not accept this conversation (e.g. a system message, or roles "
    "that do not alternate)",
    "failed": "the model's chat template does not accept this conversation (e.g. a system message)",
}
_BUDGET_HINT = "this model file's chat template is broken or hostile: use a fixed or another model file"


class TemplateProcess:
    def __init__(self, *, time_limit_s: float, memory_bytes: int, max_chars: int) -> None:
        self.time_limit_s = time_limit_s  # wall clock for one render
        self.memory_bytes = memory_bytes  # address space the worker may add to its start-up size
        self.max_chars = max_chars  # characters one render may write
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()  # the process that owns _proc (a forked child must not share its pipes)
        self._lock = threading.Lock()
        self.starts = 0  # workers started so far (tests read it)

    def render(self, source: str, variables: dict[str, Any]) -> str:
        """The template's text for `variables`; TemplateError when it fails or goes over a budget."""
        try:
            line = json.dumps({"template": source, "vars": variables}).encode("ascii") + b"\n"
        except (TypeError, ValueError) as exc:
            raise TemplateError(f"the conversation cannot be passed to the chat template: {exc}") from None
        with self._lock:
            reply = self._exchange(line)
        if reply.get("ok"):
            return str(reply["text"])
        kind = str(reply.get("kind"))
        raise TemplateError(str(reply.get("message")), _HINTS.get(kind, _BUDGET_HINT))

    def close(self) -> None:
        with self._lock:
            self._stop()

    def start_in_background(self) -> None:
        """Start the worker on a thread of its own, so its interpreter start (a few hundred ms on a 2-core
        machine) runs while the caller does other work, e.g. while a runner process loads the model; the first
        render then finds it ready (or waits for the start, as it would have).  A worker that fails to start
        here is started again, and reported, by that render."""

        def start() -> None:
            with self._lock:
                try:
                    self._ensure()
                except TemplateError:
                    pass

        threading.Thread(target=start, name="template-worker-start", daemon=True).start()

    # -- the worker ---------------------------------------------------------------------------------------
    def _exchange(self, line: bytes) -> dict[str, Any]:
        proc = self._ensure()
        deadline = time.monotonic() + self.time_limit_s
        try:
            assert proc.stdin is not None
            _write_all(proc.stdin.fileno(), line)
            answer = _read_line(proc, deadline)
        except (BrokenPipeError, OSError):
            answer = b""
        if answer is not None and answer.endswith(b"\n"):
            return json.loads(answer)
        late = answer is None
        self._stop()
        if late:
            raise TemplateError(
                f"the chat template took longer than {self.time_limit_s:g} s to render (the time budget); refused",
                _BUDGET_HINT,
            )
        raise TemplateError(
            f"the chat template renderer died (exit {proc.returncode}) while rendering; refused", _BUDGET_HINT
        )

    def _ensure(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # forked: the worker and its pipes are the parent's; leave them alone
            self._proc, self._pid = None, os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        proc = self._proc = subprocess.Popen(
            [sys.executable, _WORKER, str(self.memory_bytes), str(self.max_chars)],
            bufsize=0,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # Ctrl-C in the terminal is the parent's to handle, not the worker's
        self.starts += 1
        ready = _read_line(proc, time.monotonic() + _START_TIMEOUT_S)
        if not ready or not ready.startswith(b'{"ready"'):
            self._stop()
            raise TemplateError(
                f"the chat template renderer did not start within {_START_TIMEOUT_S:g} s ({sys.executable} {_WORKER})",
                "is jinja2 installed for this Python?",
            )
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is in the pipe (a signal may cut one write short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_line(proc: subprocess.Popen, deadline: float) -> bytes | None:
    """One line from the worker: None when `deadline` passed first, b"" (or a partial line) when it died."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    parts: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        parts.append(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return b"".join(parts)


_shared: TemplateProcess | None = None
_shared_lock = threading.Lock()


def shared(time_limit_s: float, memory_bytes: int, max_chars: int) -> TemplateProcess:
    """The process-wide worker (made at first use, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TemplateProcess(time_limit_s=time_limit_s, memory_bytes=memory_bytes, max_chars=max_chars)
            atexit.register(_shared.close)
        return _shared
