"""RunnerBackend's side of resident runners (backends/runner/resident.py), a mixin of RunnerBackend
(backends/runner/client.py): taking over a resident runner that holds this very load, ending the others (their
memory is what this load's plan counted as free), and leaving its own runner loaded for the next command when the
backend closes (keep-alive).  The methods read the backend's spec, configuration, keep-alive and prestarted
runner, and a taken-over runner sets what the backend reports (n_ctx, describe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.modelspec import ModelSpec
from backends.runner import protocol as p
from backends.runner import resident
from backends.runner.ladder import RunnerConfig
from backends.runner.process import CLOSE_TIMEOUT_S, LINGER_TIMEOUT_S, Prestarted, RunnerProcess
from backends.runner.streams import Crash


class ResidentTakeover:
    """Resident runners for RunnerBackend; the attributes below are the backend's (RunnerBackend.__init__)."""

    spec: ModelSpec
    config: RunnerConfig
    resident_dir: Path | None
    keep_alive_s: float | None
    model_name: str
    _code_stamp: str | None
    _prestarted: Prestarted | None
    _n_ctx: int
    _describe: dict[str, Any]
    _gave_up: Exception | None

    def _resident_stem(self, config: RunnerConfig) -> str | None:
        """The key of this configuration's load among resident runners (resident.load_stem); None: no residents
        here (a verbose runner writes to its command's terminal, so it never lingers and is never taken over)."""
        if self.resident_dir is None or config.options.verbose:
            return None
        if self._code_stamp is None:
            self._code_stamp = resident.code_stamp()
        return resident.load_stem(p.Load(config.backend, self.spec, config.options), self._code_stamp)

    def _take_resident(self, config: RunnerConfig) -> RunnerProcess | None:
        """A resident runner that holds this very load, taken over (loaded already), when this backend keeps
        runners (keep_alive_s != 0); otherwise, or when none holds it, every resident is ended first: they hold
        memory that this load's plan counted as free."""
        if self.resident_dir is None:
            return None
        stem = self._resident_stem(config)
        if stem is not None and self.keep_alive_s != 0:
            for found in resident.residents(self.resident_dir):
                if found.stem != stem:
                    continue
                runner = self._attach(found.path, config)
                if runner is not None:
                    return runner
        resident.evict_all(self.resident_dir)
        return None

    def _attach(self, path: Path, config: RunnerConfig) -> RunnerProcess | None:
        attached = resident.attach(path)
        if attached is None:
            return None
        runner = RunnerProcess(self, config, attached=attached)
        runner.send(p.Load(config.backend, self.spec, config.options), "load")
        outcome = runner.outcome.get()
        if not isinstance(outcome, p.Loaded):
            if not isinstance(outcome, Crash):
                runner.stop(CLOSE_TIMEOUT_S)
            return None
        runner.loaded = True
        self._n_ctx, self._describe = outcome.n_ctx, dict(outcome.describe)
        started, self._prestarted = self._prestarted, None
        if started is not None:
            started.discard()
        return runner

    def end_other_residents(self) -> int:
        """End every resident runner but those that hold this backend's very load (app/loading.open_backend: the
        plan counted their memory as taken, so it plans again after this); how many were ended."""
        if self.resident_dir is None:
            return 0
        mine = self._resident_stem(self.config) if self.keep_alive_s != 0 else None
        return sum(resident.evict(r) for r in resident.residents(self.resident_dir) if r.stem != mine)

    def _linger(self, runner: RunnerProcess) -> bool:
        """Leave `runner` loaded for the next command (keep_alive_s; backends/runner/resident.py); False when it
        must stop instead (keep-alive 0, a runner that died or never loaded, supervision gave up)."""
        if self.keep_alive_s == 0 or runner.dead or not runner.loaded or self._gave_up is not None:
            return False
        stem = self._resident_stem(self.config)
        if stem is None or self.resident_dir is None or not resident.make_private(self.resident_dir):
            return False
        if any(r.stem == stem for r in resident.residents(self.resident_dir)):
            return False  # another command's runner holds this load already: one is enough
        path = self.resident_dir / f"{stem}-{runner.pid}{resident.SUFFIX}"
        try:
            return runner.linger(self.keep_alive_s, str(path), self.model_name, LINGER_TIMEOUT_S)
        except OSError:
            return False
