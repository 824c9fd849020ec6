"""RunnerBackend: a Backend whose engine runs in a child process (a runner), supervised.  One process and its
threads are a RunnerProcess (backends/runner/process.py); the runner's own side is backends/runner/child.py.

hearth's side of the runner: it speaks the Backend contract to the app (TUI, CLI, server, bench, ppl) and typed
messages (backends/runner/protocol.py) to the runner, which holds the real backend.  A native crash, a hang or
an out-of-memory kill there costs the requests in flight, never the app.

Supervision, when a runner dies (any signal, an exit) or stops answering for `hang_timeout_s` (no heartbeat):
- every request in flight that had already streamed text ends with FinishReason.ERROR and a message that names
  the signal and what the runner was doing (error_code "runner_crashed"); a request that had streamed nothing
  yet is sent once more to the new runner, so it costs its caller only time;
- a new runner starts at once.  If the configuration that crashed never finished a reply, or crashed twice in a
  row, the next one is the next rung of the safer-configuration ladder (backends/runner/ladder.py); otherwise the
  same one (a crash after good replies is more likely the request's than the configuration's).  A runner stopped
  or killed from outside (RunnerProcess.killed_from_outside: SIGSTOP, SIGTERM, a SIGKILL that was no OOM kill)
  restarts as it was and is no crash in a row; a restart whose load crashes loads a configuration that finished
  replies again rather than giving up (a named backend has no other backend to fall to);
- a configuration the ladder found that then finished a reply is remembered (backends/runner/memory.py);
- after MAX_CRASHES_IN_A_ROW crashes without a finished reply in between, it gives up: every later call raises
  RunnerCrashedError.  While loading, a crash with no rung left ends load() with RunnerCrashedError at once (a
  crash at load repeats), and a refusal (bad file, unknown architecture) is raised as it is, never retried.

Notices ("the runner crashed ..., restarting it ...") go to `on_notice` (the TUI shows them) and to `notices`.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.api import (
    Backend,
    Capabilities,
    GenerationEvent,
    LoadOptions,
    ProgressCallback,
    Request,
)
from backends.env import env_seconds
from backends.errors import HearthError, RunnerCrashedError
from backends.modelspec import ModelSpec
from backends.registry import backend_class, get_backend_info
from backends.runner import protocol as p
from backends.runner.calls import RunnerCalls
from backends.runner.ladder import Fallback, RunnerConfig, next_config
from backends.runner.memory import ConfigMemory, machine_key
from backends.runner.process import CLOSE_TIMEOUT_S, Prestarted, RunnerProcess  # Prestarted: for app/loading.py
from backends.runner.streams import Crash, StreamState, aborted_event, translate
from backends.runner.takeover import ResidentTakeover

log = logging.getLogger(__name__)

DEFAULT_HANG_TIMEOUT_S = 30.0  # no heartbeat for this long = frozen (HEARTH_RUNNER_TIMEOUT overrides)
MAX_CRASHES_IN_A_ROW = 4
_LOGS_KEPT = 20


def _config_key(config: RunnerConfig) -> tuple:
    """A runner configuration as what tells it from the ladder's other rungs (RunnerConfig.changes)."""
    return tuple(sorted((k, str(v)) for k, v in config.changes().items()))


def hang_timeout_from_env() -> float:
    return env_seconds("HEARTH_RUNNER_TIMEOUT", DEFAULT_HANG_TIMEOUT_S)


def config_memory_at(path: str | os.PathLike[str]) -> ConfigMemory:
    """The memory of what worked (backends/runner/memory.py) for this machine, kept in the file at `path`."""
    return ConfigMemory(path, machine_key())


def backend_facts(name: str) -> tuple[str, Capabilities]:
    """(name, capabilities) of a registry backend or a "module:Class" one, without importing a registry one."""
    if ":" in name:
        cls = backend_class(name)
        return cls.name, cls.capabilities
    info = get_backend_info(name)
    return info.name, info.capabilities


class RunnerBackend(ResidentTakeover, RunnerCalls, Backend):
    """A Backend in a runner process.  `backend` is the registry name (or "module:Class") the runner loads;
    `fallback(name)` gives LoadOptions for another backend where it runs this model (the ladder's last rung);
    `memory` remembers what worked."""

    def __init__(
        self,
        spec: ModelSpec,
        options: LoadOptions | None = None,
        *,
        backend: str,
        fallback: Fallback | None = None,
        memory: ConfigMemory | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        hang_timeout_s: float | None = None,
        prestarted: Prestarted | None = None,
        resident_dir: Path | None = None,
        keep_alive_s: float | None = 0.0,
        model_name: str | None = None,
    ) -> None:
        super().__init__(spec, options)
        self.config = RunnerConfig(backend, self.options)
        self.fallback = fallback
        self.memory = memory
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "hearth-runners"
        self.hang_timeout_s = hang_timeout_s or hang_timeout_from_env()
        self.notices: list[str] = []
        self._lock = threading.RLock()
        self._runner: RunnerProcess | None = None  # the loaded runner; None while (re)starting
        self._ready = threading.Condition(self._lock)
        self._gave_up: RunnerCrashedError | None = None
        self._closed = False
        self._streams: dict[str, StreamState] = {}
        self._call_ids = itertools.count(1)
        self._n_ctx = self.options.n_ctx
        self._describe: dict[str, Any] = {}
        self._proven = False  # the current configuration finished a reply
        self._crashes_in_row = 0
        self._served: set[tuple] = set()  # configurations (_config_key) that finished a reply in this backend's life
        self._tried_backends: set[str] = set()
        self._log_ids = itertools.count()
        self._progress: ProgressCallback | None = None
        self._unloaded = False  # unload() stopped the runner; the next call starts one again (_reload)
        self._reloading = False  # a thread is starting that runner now; the others wait for it
        # a runner started before the model was planned (process.Prestarted): the first load adopts it
        self._prestarted = prestarted
        # resident runners (backends/runner/resident.py): `resident_dir` is where they listen; with keep_alive_s
        # other than 0 this backend takes one over that holds its very load, and its own runner lingers that long
        # (None: until ended) after close(); with 0 it ends any it meets before it starts a runner (their memory)
        self.resident_dir = resident_dir
        self.keep_alive_s = keep_alive_s
        self._code_stamp: str | None = None
        self.model_name = model_name or spec.name  # as the user calls it (`hearth ps`)
        if memory is not None:
            self._apply_memory(memory)

    @property  # type: ignore[override]
    def name(self) -> str:  # the backend the current configuration runs (the ladder may change it)
        return backend_facts(self.config.backend)[0]

    @property  # type: ignore[override]
    def capabilities(self) -> Capabilities:
        return backend_facts(self.config.backend)[1]

    # -- what worked before -------------------------------------------------------------------------------
    def _apply_memory(self, memory: ConfigMemory) -> None:
        entry = memory.recall(self.spec)
        if not entry:
            return
        backend = entry.get("backend", self.config.backend)
        options = self.options
        if backend != self.config.backend:
            alt = self.fallback(backend) if self.fallback else None
            if alt is None:
                return
            options = alt
        changes: dict[str, Any] = {}
        if entry.get("extra_bufts") is False:
            changes["extra_bufts"] = False
        if isinstance(entry.get("n_gpu_layers"), int) and options.n_gpu_layers != 0:
            changes["n_gpu_layers"] = entry["n_gpu_layers"]
        why = f"remembered from {entry.get('when', 'an earlier run')}: {entry.get('why', 'a safer configuration')}"
        self.config = RunnerConfig(backend, replace(options, **changes), why)
        self._notice(f"starting {self.spec.name} {why}")

    def new_log_path(self) -> Path:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        logs = sorted(self.log_dir.glob("runner-*.log"), key=lambda q: q.stat().st_mtime)
        for old in logs[:-_LOGS_KEPT]:
            try:
                old.unlink()
            except OSError:
                pass
        return self.log_dir / f"runner-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}-{next(self._log_ids)}.log"

    def _notice(self, text: str) -> None:
        self.notices.append(text)
        try:
            self.on_notice(text)
        except Exception:
            log.debug("on_notice raised on %r", text, exc_info=True)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def load(self, progress: ProgressCallback | None = None) -> None:
        with self._lock:
            if self._runner is not None:
                return
            unloaded = self._unloaded
        if unloaded:
            self._reload(progress)
            return
        runner, config = self._bring_up(self.config, progress)
        with self._lock:
            self._install(runner, config)

    def unload(self) -> bool:
        """Stop the runner while nothing runs, so all of its RAM and VRAM go back to the system; the next call
        (a stream, tokenize, embed, load) starts a new runner with the same configuration.  The API server's
        keep_alive (Ollama's: unload after idle) calls this."""
        with self._lock:
            if self._closed or self._runner is None or self._streams or self._runner.calls:
                return False
            runner, self._runner = self._runner, None
            self._unloaded = True
        runner.stop(CLOSE_TIMEOUT_S)
        return True

    @property
    def resident(self) -> bool:
        return not self._unloaded

    def _reload(self, progress: ProgressCallback | None = None) -> None:
        """Start the runner again after unload(), in this thread, unless another thread is doing it (then wait
        for that one).  Called without the lock held."""
        with self._lock:
            if not self._unloaded:
                return
            if self._reloading:
                while self._reloading and not self._closed:
                    self._ready.wait()
                return
            self._reloading = True
        try:
            runner, config = self._bring_up(self.config, progress)
        except BaseException as exc:
            with self._lock:
                self._reloading = False
                if isinstance(exc, HearthError):  # waiting callers get the error instead of waiting forever
                    self._gave_up = (
                        exc if isinstance(exc, RunnerCrashedError) else RunnerCrashedError(exc.message, exc.hint)
                    )
                self._ready.notify_all()
            raise
        with self._lock:
            self._reloading = self._unloaded = False
            if self._closed:
                self._ready.notify_all()
            else:
                self._install(runner, config)
                return
        runner.stop(CLOSE_TIMEOUT_S)

    def _reload_quietly(self) -> None:
        try:
            self._reload()
        except BaseException:  # noqa: BLE001 - _reload recorded it for the waiting callers (_gave_up)
            pass

    def _bring_up(self, config: RunnerConfig, progress: ProgressCallback | None) -> tuple[RunnerProcess, RunnerConfig]:
        """Start runners down the ladder until one loads.  Raises the runner's own error for a refusal (bad file,
        unknown architecture: no retries) and RunnerCrashedError when no rung is left."""
        attempts = 0
        while True:
            if self._closed:
                raise RunnerCrashedError("the backend was closed while its runner was starting")
            self._tried_backends.add(config.backend)
            if attempts == 0:
                taken = self._take_resident(config)
                if taken is not None:
                    return taken, config
            self._progress = progress
            runner = RunnerProcess(self, config, self._take_prestarted(config))
            runner.send(p.Load(config.backend, self.spec, config.options), "load")
            outcome = runner.outcome.get()
            self._progress = None
            if isinstance(outcome, p.Loaded):
                runner.loaded = True
                self._n_ctx, self._describe = outcome.n_ctx, dict(outcome.describe)
                return runner, config
            attempts += 1
            if isinstance(outcome, p.LoadFailed):
                runner.stop(CLOSE_TIMEOUT_S)
                if outcome.error.type != "OutOfMemoryError":
                    p.raise_error(outcome.error)  # bad input or a refusal: the same file fails the same way
                failure = "oom"
                what = f"the {backend_facts(config.backend)[0]} runner ran out of memory loading {self.spec.name}"
            else:
                failure, what = "crash", outcome.message
            nxt = self._after_load_crash(config, failure, runner)
            if nxt is None or attempts >= MAX_CRASHES_IN_A_ROW:
                raise RunnerCrashedError(
                    f"{what}; no safer configuration is left", f"the runner log is {runner.log_path}"
                )
            self._notice(f"{what}; retrying {nxt.why}")
            if progress:
                progress(0.0, f"retrying {nxt.why}")
            config = nxt

    def release_prestarted(self) -> Prestarted | None:
        """The prestarted runner, handed to another backend (this one is then dropped unloaded)."""
        started, self._prestarted = self._prestarted, None
        return started

    def _take_prestarted(self, config: RunnerConfig) -> Prestarted | None:
        """The prestarted runner when it can serve `config` (once); one that cannot is ended."""
        started, self._prestarted = self._prestarted, None
        if started is not None and not started.fits(config.backend, config.options.verbose):
            started.discard()
            return None
        return started

    def _after_load_crash(self, config: RunnerConfig, failure: str, runner: RunnerProcess) -> RunnerConfig | None:
        """What to load after `config`'s runner died loading: the same configuration when it was stopped or killed
        from outside, or when it is one that has finished replies before in this backend's life (a restart after
        a crash: its load is known good, so the crash is more likely the moment's than the configuration's);
        else the ladder's next rung (None: no rung left)."""
        if failure == "crash" and (runner.killed_from_outside() or _config_key(config) in self._served):
            return config
        return self._next(config, failure)

    def _next(self, config: RunnerConfig, failure: str) -> RunnerConfig | None:
        _, caps = backend_facts(config.backend)
        return next_config(
            config,
            n_layers=self.spec.n_layers,
            failure=failure,
            honours_extra_bufts=caps.extra_bufts,
            tried_backends=frozenset(self._tried_backends),
            fallback=self.fallback,
        )

    def _install(self, runner: RunnerProcess, config: RunnerConfig) -> None:
        """Make `runner` the current one (lock held)."""
        self._runner, self.config = runner, config
        self.options = config.options
        self._proven = False
        self._ready.notify_all()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            runner, self._runner = self._runner, None
            prestarted, self._prestarted = self._prestarted, None
            states = list(self._streams.values())
            self._ready.notify_all()
        if prestarted is not None:  # closed before its first load
            prestarted.discard()
        for state in states:  # close() aborts what still runs: each stream ends as aborted, with its text so far
            state.aborted = True
            self._route(
                state,
                aborted_event(state.request.request_id),
            )
        if runner is not None and (states or not self._linger(runner)):
            runner.stop(CLOSE_TIMEOUT_S)

    def _current(self) -> RunnerProcess:
        """The loaded runner, waiting while one restarts; raises once supervision gave up or after close()."""
        with self._lock:
            while True:
                if self._gave_up is not None:
                    raise self._gave_up
                if self._closed:
                    raise RunnerCrashedError("the backend is closed", "load the model again")
                if self._runner is not None and not self._runner.dead:
                    return self._runner
                if self._unloaded and not self._reloading:
                    # a thread of its own, since the caller may hold the lock; should two start, _reload lets the
                    # first one that takes the lock start the runner and the other waits
                    threading.Thread(target=self._reload_quietly, name="runner-reload", daemon=True).start()
                self._ready.wait()

    @property
    def pid(self) -> int | None:
        """The current runner's process id (None while none runs)."""
        runner = self._runner
        return runner.pid if runner is not None else None

    # -- messages from runners (reader threads) -----------------------------------------------------------
    def on_message(self, runner: RunnerProcess, m: p.FromRunner) -> None:
        if isinstance(m, p.Heartbeat):
            return
        if isinstance(m, p.Event):
            state = self._streams.get(m.event.request_id)
            if state is not None and state.runner is runner:
                self._route(state, m.event)
        elif isinstance(m, p.Events):  # one step's events of several streams, sent together
            for event in m.events:
                state = self._streams.get(event.request_id)
                if state is not None and state.runner is runner:
                    self._route(state, event)
        elif isinstance(m, p.StreamFailed):
            state = self._streams.get(m.request_id)
            if state is not None and state.runner is runner:
                self._route(state, m.error)
        elif isinstance(m, p.Progress):
            if self._progress is not None:
                self._progress(m.fraction, m.what)
        elif isinstance(m, (p.Loaded, p.LoadFailed)):
            runner.outcome.put(m)
        elif isinstance(m, p.Closed):
            runner.closed.set()
        elif isinstance(m, p.Lingering):
            runner.lingered.set()
        else:  # a reply to a call
            future = runner.calls.pop(m.call_id, None)
            if future is not None:
                future.set_result(m)

    def on_death(self, runner: RunnerProcess) -> None:
        """The runner's socket ended: a planned close, or a crash to recover from."""
        if runner.lingering:  # it stays, loaded, for the next command
            return
        if runner.closing:
            runner.proc.wait()
            return
        with self._lock:  # from here on nothing new is sent to this runner (see _current)
            runner.dead = True
            streams = [s for s in self._streams.values() if s.runner is runner]
            activity = runner.activity(streams)
            calls, runner.calls = runner.calls, {}
        message = (
            f"the {backend_facts(runner.config.backend)[0]} runner (pid {runner.pid}) {runner.exit_cause()} {activity}"
        )
        for future in calls.values():
            future.set_exception(RunnerCrashedError(message, f"the runner log is {runner.log_path}"))
        if not runner.loaded:  # load() or a restart waits for this runner: it decides what comes next
            runner.outcome.put(Crash(message))
            return
        outside = runner.killed_from_outside()
        with self._lock:
            if self._closed or runner is not self._runner:
                return
            self._runner = None
            if outside:  # not this configuration's doing: the same one again, and no crash in a row
                safer = None
                plan = "restarting it as it was (stopped or killed from outside, not a crash of its own)"
            else:
                self._crashes_in_row += 1
                safer = None if self._proven and self._crashes_in_row < 2 else self._next(self.config, "crash")
                plan = f"restarting it {safer.why}" if safer is not None else "restarting it"
            nxt: RunnerConfig | None = safer or self.config
            if self._crashes_in_row >= MAX_CRASHES_IN_A_ROW and not outside:
                nxt = None
                self._gave_up = RunnerCrashedError(
                    f"{message}; it crashed {self._crashes_in_row} times in a row without finishing a reply, so "
                    "hearth stopped restarting it",
                    f"the runner log is {runner.log_path}",
                )
                self._ready.notify_all()
            replays = []
            for state in streams:
                if nxt is not None and state.tokens == 0 and state.replays == 0 and not state.aborted:
                    replays.append(state)  # nothing shown yet: it runs again on the new runner
                else:
                    lost = "this reply is cut off" if state.tokens else "this request failed"
                    self._route(
                        state,
                        Crash(
                            f"{message}: {lost}; hearth is {plan}"
                            if nxt is not None
                            else self._gave_up.message
                            if self._gave_up
                            else message
                        ),
                    )
        self._notice(f"{message}; hearth is {plan}" if nxt is not None else str(self._gave_up))
        if nxt is not None:
            threading.Thread(target=self._restart, args=(nxt, replays), name="runner-restart", daemon=True).start()

    def _restart(self, config: RunnerConfig, replays: list[StreamState]) -> None:
        try:
            runner, config = self._bring_up(config, None)
        except HearthError as exc:
            with self._lock:
                self._gave_up = (
                    exc if isinstance(exc, RunnerCrashedError) else RunnerCrashedError(exc.message, exc.hint)
                )
                self._ready.notify_all()
            for state in replays:
                self._route(state, Crash(self._gave_up.message))
            self._notice(f"could not restart the runner: {exc.one_line()}")
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._install(runner, config)
        if closed:
            runner.stop(CLOSE_TIMEOUT_S)
            return
        with self._lock:
            for state in replays:
                if state.aborted:
                    self._route(
                        state,
                        aborted_event(state.request.request_id),
                    )
                    continue
                state.replays += 1
                state.runner = runner
                runner.send(p.Stream(state.request), f"stream({state.request.request_id})")
        self._notice(
            f"a new {config.backend} runner (pid {runner.pid}) is ready" + (f", {config.why}" if config.why else "")
        )

    def _finished_ok(self) -> None:
        with self._lock:
            self._crashes_in_row = 0
            self._served.add(_config_key(self.config))
            if self._proven:
                return
            self._proven = True
            config = self.config
        if self.memory is not None and config.why and not config.why.startswith("remembered"):
            self.memory.remember(self.spec, config.changes(), config.why)

    # -- generation ---------------------------------------------------------------------------------------
    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        state = self._open(request, None)
        try:
            while not state.done:
                for item in self._translate(state, state.queue.get()):
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            with self._lock:
                self._streams.pop(request.request_id, None)
            if not state.done:  # the caller stopped reading: stop the request in the runner
                state.aborted = True
                state.runner.send(p.Abort(request.request_id), f"abort({request.request_id})")

    def stream_to(self, request: Request, sink: Callable[[GenerationEvent | BaseException], None]) -> None:
        """stream() without a thread per request: each event, or the exception stream() would raise, is handed to
        `sink` from the thread that receives it from the runner (keep `sink` short and thread-safe, e.g.
        loop.call_soon_threadsafe); the last item is a FINISHED event or an exception.  `abort(request_id)`
        stops it.  The API server serves its streams this way: one hand-off per event instead of two threads."""
        self._open(request, sink)

    def _open(self, request: Request, sink: Callable[[GenerationEvent | BaseException], None] | None) -> StreamState:
        rid = request.request_id
        with self._lock:
            runner = self._current()
            state = StreamState(request, runner, sink=sink)
            self._streams[rid] = state
            runner.send(p.Stream(request), f"stream({rid})")
        return state

    def _route(self, state: StreamState, item: Any) -> None:
        """An item for a stream (event, ErrorInfo, Crash): queued for its reader, or translated for its sink."""
        if state.sink is None:
            state.queue.put(item)
            return
        for out in self._translate(state, item):
            state.sink(out)
        if state.done:
            with self._lock:
                self._streams.pop(state.request.request_id, None)

    def _translate(self, state: StreamState, item: Any) -> list[GenerationEvent | BaseException]:
        out = translate(state, item)
        if out and state.ended_well:  # translate() hands over the last item once: one call per finished reply
            self._finished_ok()
        return out

    def abort(self, request_id: str) -> None:
        state = self._streams.get(request_id)
        if state is not None:
            state.aborted = True
            state.runner.send(p.Abort(request_id), f"abort({request_id})")

    @property
    def n_ctx(self) -> int:
        return self._n_ctx
