"""The runner process: holds one loaded Backend and serves hearth's messages (backends/runner/protocol.py).

Started by RunnerBackend as `python -m backends.runner.child --fd N`, with the socket on fd N and stdout/stderr
in the runner log.  Threads: the main thread reads messages; each stream and each call runs on a thread of its
own (a backend that serialises queues them itself, as in one process); a stream thread's event is sent before that
thread goes on (so a crash never loses an event already produced), and whichever stream thread holds the socket
sends every event that other streams queued meanwhile in one `Events` frame (a batching engine's step gives every
stream a token at once: a few frames, and as few wake-ups of hearth's reader, instead of one per stream); a
heartbeat thread says "alive" every HEARTBEAT_S, so hearth can tell a frozen runner from a busy one.  When
hearth's end of the socket closes (hearth exited or was killed), the runner exits at once: it never outlives
the app, except when its owner asked it to linger (a Linger message: it then waits, loaded, for the next
command on a socket of its own, backends/runner/resident.py).  (Not PR_SET_PDEATHSIG: it fires when the
*thread* that started the runner ends, and runners are started from worker threads.)
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import socket
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any, NoReturn

from backends.api import EventKind, FinishReason, GenerationEvent, RequestStats
from backends.registry import backend_class, get_backend_info
from backends.runner import protocol as p

HEARTBEAT_S = 0.5
RESIDENT_MISMATCH = "ResidentMismatch"  # a resident runner asked for a load other than the one it holds


class RunnerServer:
    def __init__(self, channel: p.Channel) -> None:
        self.channel = channel
        self.backend: Any = None
        self._send_lock = threading.Lock()
        self._closing = threading.Event()
        self._outbox: deque = deque()  # stream events not sent yet (append/popleft are atomic)
        self._loaded_with: p.Load | None = None  # the Load this runner answered (a resident compares the next)
        self._lingering = False  # between owners (Linger): nothing is sent

    def send(self, message: p.FromRunner) -> None:
        with self._send_lock:
            if self._lingering:
                return
            try:
                self.channel.send(message)
            except OSError:  # hearth is gone: nothing left to tell
                os._exit(0)

    def serve(self) -> None:
        threading.Thread(target=self._heartbeat, name="runner-heartbeat", daemon=True).start()
        while True:
            try:
                message = self.channel.recv()
            except (OSError, p.ProtocolError):
                message = None
            if message is None:  # hearth closed the socket or died: do not outlive it
                os._exit(0)
            if isinstance(message, p.Linger):
                self._linger(message)  # on this thread: nothing is read until the next owner connects
                continue
            self.handle(message)

    def _heartbeat(self) -> None:
        pid = os.getpid()
        while not self._closing.wait(HEARTBEAT_S):
            self.send(p.Heartbeat(pid))

    def _emit(self, event: Any) -> None:
        """Send a stream's event, with every event other streams queued meanwhile (see the module docstring)."""
        self._outbox.append(event)
        with self._send_lock:
            events = []
            while self._outbox:
                events.append(self._outbox.popleft())
            if not events:
                return  # another stream thread sent ours with its own
            try:
                self.channel.send(p.Event(events[0]) if len(events) == 1 else p.Events(events))
            except OSError:  # hearth is gone: nothing left to tell
                os._exit(0)

    def _spawn(self, fn: Any, *args: Any) -> None:
        threading.Thread(target=fn, args=args, daemon=True).start()

    def handle(self, m: p.ToRunner) -> None:
        if isinstance(m, p.Load):
            self._spawn(self._load, m)
        elif isinstance(m, p.Stream):
            self._spawn(self._stream, m.request)
        elif isinstance(m, p.Abort):
            if self.backend is not None:
                self.backend.abort(m.request_id)
        elif isinstance(m, p.Close):
            self._close()
        else:
            self._spawn(self._call, m)

    def _load(self, m: p.Load) -> None:
        if self.backend is not None:  # a resident runner's next owner: only the very same load is served here
            if m == self._loaded_with:
                self.send(p.Loaded(self.backend.n_ctx, dict(self.backend.describe())))
            else:
                self.send(p.LoadFailed(p.ErrorInfo(RESIDENT_MISMATCH, "this runner holds another load")))
            return
        try:
            cls = backend_class(m.backend)
            backend = cls(m.spec, m.options)
            backend.load(lambda fraction, what: self.send(p.Progress(float(fraction), str(what))))
            self.backend, self._loaded_with = backend, m
            self.send(p.Loaded(backend.n_ctx, dict(backend.describe())))
        except Exception as exc:  # noqa: BLE001 - every load failure goes back to hearth, typed
            self.send(p.LoadFailed(p.error_info(exc)))

    def _stream(self, request: Any) -> None:
        started = False
        try:
            for event in self.backend.stream(request):
                started = True
                self._emit(event)
        except Exception as exc:  # noqa: BLE001
            if not started:
                self.send(p.StreamFailed(request.request_id, p.error_info(exc)))
            else:  # a backend broke the contract (exception after STARTED): end the stream as an error
                self._emit(
                    GenerationEvent(
                        EventKind.FINISHED,
                        request.request_id,
                        finish_reason=FinishReason.ERROR,
                        stats=RequestStats(),
                        error=p.error_info(exc).message,
                    )
                )

    def _call(self, m: Any) -> None:
        b = self.backend
        try:
            if isinstance(m, p.Tokenize):
                reply: Any = p.TokensReply(m.call_id, b.tokenize(m.text, m.add_special, m.parse_special))
            elif isinstance(m, p.Detokenize):
                reply = p.TextReply(m.call_id, b.detokenize(m.token_ids))
            elif isinstance(m, p.Logits):
                import numpy as np  # lazy: heavy: numpy

                array = np.ascontiguousarray(b.logits(m.token_ids), dtype=np.float32)
                reply = p.ArrayReply(m.call_id, list(array.shape), array.tobytes())
            elif isinstance(m, p.Embed):
                import numpy as np  # lazy: heavy: numpy

                array = np.ascontiguousarray(b.embed(m.inputs), dtype=np.float32)
                reply = p.ArrayReply(m.call_id, list(array.shape), array.tobytes())
            elif isinstance(m, p.Describe):
                reply = p.DescribeReply(m.call_id, dict(b.describe()))
            elif isinstance(m, p.Stats):
                reply = p.StatsReply(m.call_id, b.stats())
            elif isinstance(m, p.KernelReportCall):  # no model needed: a runner of its own (runner/oneshot.py)
                info = get_backend_info(m.backend)
                reply = p.KernelReportReply(m.call_id, info.run_kernel_report(m.spec, m.record, m.check_now))
            else:
                raise TypeError(f"unknown message {type(m).__name__}")
        except Exception as exc:  # noqa: BLE001
            reply = p.CallFailed(m.call_id, p.error_info(exc))
        self.send(reply)

    def _linger(self, m: p.Linger) -> None:
        """Stay loaded for the next command (backends/runner/resident.py): listen at m.path, tell this owner
        (Lingering) and leave its socket; serve whoever connects within m.seconds as its owner, else exit."""
        from backends.runner import resident  # lazy: only a lingering runner needs it

        path = Path(m.path)
        if self.backend is None or self._loaded_with is None:
            self._close()
        with contextlib.ExitStack() as stack:
            try:
                listener = stack.enter_context(resident.listening(path))
            except OSError as exc:
                print(f"runner: cannot listen at {path}: {exc}; exiting instead of lingering", file=sys.stderr)
                self._close()
            resident.describe_file(path, self._loaded_with.backend, m.model, m.seconds)  # before the owner leaves
            with self._send_lock:
                try:
                    self.channel.send(p.Lingering())
                except OSError:
                    pass
                self._lingering = True
                try:
                    self.channel.sock.close()
                except OSError:
                    pass
            seconds = "ever" if m.seconds is None else f"{m.seconds:g} s"
            print(f"runner: lingering for {seconds} at {path}", file=sys.stderr)
            sys.stderr.flush()
            conn = resident.wait_for_owner(listener, m.seconds)
        if conn is None:
            print("runner: nobody came back; exiting", file=sys.stderr)
            self._close()
        with self._send_lock:
            self.channel = p.Channel(conn, p.ToRunner)
            self._lingering = False
        self.send(p.Resumed(os.getpid(), m.log_path))
        print("runner: resumed by the next command", file=sys.stderr)
        sys.stderr.flush()

    def _close(self) -> NoReturn:
        self._closing.set()
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception as exc:  # noqa: BLE001 - the process exits anyway, freeing everything
                print(f"runner: close failed: {exc}", file=sys.stderr)
        self.send(p.Closed())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _preload(backend: str) -> None:
    """Import `backend`'s module (for the torch engine, torch: ~1 s) while hearth still plans the model
    (process.Prestarted).  No torch op runs here, so no OpenMP team starts on this thread.  A failure is left to
    the Load message, whose own import raises it again and reports it as LoadFailed."""
    try:
        backend_class(backend)
    except BaseException:  # noqa: BLE001 - reported by _load, which imports it again
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hearth-runner")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--preload", default=None, help="a backend to import while waiting for the Load message")
    args = parser.parse_args(argv)
    if args.preload:
        threading.Thread(target=_preload, args=(args.preload,), name="runner-preload", daemon=True).start()
    faulthandler.enable()  # a native crash leaves the Python stacks of every thread in the runner log
    os.environ["HEARTH_RUNNER"] = "1"  # a tensor-parallel group that loses a rank ends this process (torch_engine/tp)
    sock = socket.socket(fileno=args.fd)
    RunnerServer(p.Channel(sock, p.ToRunner)).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
