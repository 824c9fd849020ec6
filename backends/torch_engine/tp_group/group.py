"""Rank 0's side of a tensor-parallel group: spawn ranks 1..N-1, hand them each step, watch them, end them.

Each step's inputs (token ids, start positions, block tables: what ModelRunner.forward builds positions and the
slot mapping from) go to every rank over its own pipe, not a collective: an idle rank then waits in a pipe read,
which ends with EOF the moment rank 0's process dies (so a rank never outlives the runner that owns it), while
a collective would time out every HEARTH_TP_TIMEOUT_S of idleness.  Only the forward's all-reduces and the
logits gather are collectives.

A dead rank takes the whole group down: a watcher thread waits on every rank's socket (a rank sends nothing once
loaded, so its socket turning readable means EOF: it ended); when one ends unasked it kills the others and marks the
group down (the next step raises TensorParallelError; a collective already in flight fails at once, its peer's sockets
being closed).  Inside a runner process (HEARTH_RUNNER=1) it then ends the runner itself, so that the runner's
supervision (backends/runner/client.py) restarts the model with a fresh group: a KV cache half lost with a rank cannot
be trusted, prefix cache included."""

from __future__ import annotations

import dataclasses
import multiprocessing.connection as mpc
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from backends.api import LoadOptions
from backends.errors import ModelLoadError, TensorParallelError
from backends.modelspec import ModelSpec

CLOSE_TIMEOUT_S = 10.0
RUNNER_EXIT_CODE = 3  # the runner's exit status when its group went down (the runner log says why)


def rank_options(options: LoadOptions, rank: int, world: int) -> LoadOptions:
    """The LoadOptions one rank loads with: its own GPU (cuda:first+rank), and on CPU its share of the cores."""
    device = options.device
    if device.startswith("cuda:"):
        device = f"cuda:{int(device.split(':', 1)[1]) + rank}"
    elif device == "cuda" or device == "auto" and _cuda_available():
        device = f"cuda:{rank}"
    else:
        device = "cpu"
    threads = options.n_threads
    if not device.startswith("cuda"):
        threads = max(1, (threads or _physical_cores()) // world)
    return dataclasses.replace(options, device=device, n_threads=threads)


def _cuda_available() -> bool:
    import torch  # lazy: heavy: torch (~3 s)

    return torch.cuda.is_available()


def _physical_cores() -> int:
    try:
        import psutil  # lazy: optional dependency (ImportError handled)

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover - psutil is a dependency
        return os.cpu_count() or 1


def _exit_cause(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _start_rank(rank: int, world: int, port: int) -> tuple[subprocess.Popen, mpc.Connection]:
    """`python -m backends.torch_engine.tp_group.worker` with one end of a socket pair (not multiprocessing's spawn,
    which re-imports the parent's __main__ script: a script without a __main__ guard would load twice)."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in sys.path if x and os.path.isdir(x))
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "backends.torch_engine.tp_group.worker",
                "--fd",
                str(theirs.fileno()),
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--port",
                str(port),
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
    finally:
        theirs.close()
    return proc, mpc.Connection(ours.detach())


class WorkerGroup:
    """Ranks 1..world-1 as child processes, joined with this process (rank 0) in one torch.distributed group."""

    def __init__(self, spec: ModelSpec, options: LoadOptions, world: int) -> None:
        from backends.torch_engine.tp.comm import init_group, make_store  # lazy: heavy: torch (~3 s)

        self.world = world
        self.down_reason: str | None = None
        self._closing = False
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = mpc.Pipe(duplex=False)
        store = make_store(world)
        self.procs: list[subprocess.Popen] = []
        self.conns: list[mpc.Connection] = []
        try:
            for rank in range(1, world):
                proc, conn = _start_rank(rank, world, store.port)
                self.procs.append(proc)
                self.conns.append(conn)
                conn.send((spec, rank_options(options, rank, world)))
            self._wait_all("hello", "starting")  # each rank says hello just before it joins the group
            import torch  # lazy: heavy: torch (~3 s)

            from backends.torch_engine.devices import resolve_device  # lazy: heavy: torch (~3 s)

            device = resolve_device(rank_options(options, 0, world).device)
            if device.type == "cuda":
                torch.cuda.set_device(device)
            self.comm = init_group(0, world, store.port, device, store=store)
        except BaseException:
            self._kill_all()
            raise
        self._store = store
        self._watcher: threading.Thread | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_ready(self) -> None:
        """Block until every rank has loaded its share (or raise what went wrong); then start watching them."""
        self._wait_all("ready", "loading its share of the model")
        self._watcher = threading.Thread(target=self._watch, name="hearth-tp-watcher", daemon=True)
        self._watcher.start()

    def _wait_all(self, kind: str, doing: str) -> None:
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            try:
                msg = conn.recv()  # EOF when the rank died
            except (EOFError, OSError):
                msg = None
            if msg is not None and msg[0] == kind:
                continue
            if msg is not None and msg[0] == "failed":
                raise ModelLoadError(
                    f"tensor-parallel rank {rank} failed while {doing}: {msg[1]}",
                    msg[2] or "see the runner log for its traceback",
                )
            raise TensorParallelError(
                f"tensor-parallel rank {rank} (pid {proc.pid}) {_exit_cause(_code(proc))} while {doing}",
                "see the runner log; a rank that runs out of memory is killed by the OS",
            )

    def send(self, message: tuple) -> None:
        """Hand every rank a message (a step's inputs); raises TensorParallelError when the group is down."""
        self.check()
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(message)
            except (OSError, ValueError) as exc:
                self.down(f"rank {rank} could not be reached ({exc})")
                self.check()

    def check(self) -> None:
        if self.down_reason is not None:
            raise TensorParallelError(
                f"the tensor-parallel group is down: {self.down_reason}",
                "load the model again (in a runner process hearth restarts it itself)",
            )

    def down(self, reason: str) -> None:
        """The group is unusable: kill every rank; inside a runner, end the runner too (module docstring)."""
        with self._lock:
            if self.down_reason is not None or self._closing:
                return
            self.down_reason = reason
        self._kill_all()
        if os.environ.get("HEARTH_RUNNER") == "1":
            print(
                f"hearth tensor parallel: {reason}; the group is down and this runner exits so that hearth restarts it",
                file=sys.stderr,
                flush=True,
            )
            os._exit(RUNNER_EXIT_CODE)

    def dead_rank(self, wait_s: float = 2.0) -> str | None:
        """Which rank ended, if one did within wait_s: a collective that failed on rank 0 is most often a peer
        that died (its sockets closed before the watcher saw its exit), and the reason should name that rank."""
        deadline = time.monotonic() + wait_s
        for rank, proc in enumerate(self.procs, start=1):
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
            return f"rank {rank} (pid {proc.pid}) {_exit_cause(code)}"
        return None

    def _watch(self) -> None:
        """A rank sends nothing once ready: its end of the socket becoming readable means it ended (EOF)."""
        ranks = {id(c): (rank, p) for rank, (p, c) in enumerate(zip(self.procs, self.conns), start=1)}
        ready = mpc.wait(list(self.conns) + [self._stop_r])
        if self._stop_r in ready or self._closing:
            return
        rank, proc = ranks[id(ready[0])]
        self.down(f"rank {rank} (pid {proc.pid}) {_exit_cause(_code(proc))}")

    def close(self) -> None:
        """Tell every rank to stop, wait for them (CLOSE_TIMEOUT_S), kill what is left, leave the group."""
        from backends.torch_engine.tp.comm import leave_group  # lazy: heavy: torch (~3 s)

        with self._lock:
            self._closing = True
        try:
            self._stop_w.send(None)
        except OSError:
            pass
        for conn in self.conns:
            try:
                conn.send(("close",))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill_all()
        for conn in self.conns:
            conn.close()
        leave_group()

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()  # reaped: no zombie left behind


def _code(proc: subprocess.Popen) -> int | None:
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None
