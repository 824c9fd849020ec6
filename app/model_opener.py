"""How `hearth serve` opens another registered model on demand (app/server/pool.py's Opener): the same load as
the model it started with (app/loading.py: planned for serving, in its own runner process), with the server's
settings and flags, planned for the hardware report the pool gives (the start-up one less what is loaded).
The plan's reasons go to stderr as the first model's did."""

from __future__ import annotations

import sys
from typing import TextIO

from app.loading import decide, open_backend
from app.server.pool import Opened
from app.settings import Settings
from app.store import ModelStore
from hwprobe.plan_types import Plan
from hwprobe.report import HardwareReport


class ServeOpener:
    def __init__(self, settings: Settings, hardware_file: str | None, err: TextIO | None = None) -> None:
        self.settings, self.hardware_file = settings, hardware_file
        self.err = err or sys.stderr

    def _settings(self, name: str) -> Settings:
        return self.settings.merged(model=name)

    def plan(self, name: str, report: HardwareReport | None) -> Plan:
        """The plan `name` gets for `report` (None: a probe), without loading anything."""
        _, spec = ModelStore().spec(name)
        decision = decide(spec, self._settings(name), self.hardware_file, serving=True, command="serve", report=report)
        assert decision.plan is not None
        return decision.plan

    def __call__(self, name: str, report: HardwareReport | None) -> Opened:
        loaded = open_backend(
            self._settings(name), hardware_file=self.hardware_file, serving=True, command="serve", report=report
        )
        for reason in loaded.decision.reasons:
            print(f"plan ({loaded.entry.name}): {reason}", file=self.err)
        described = ", ".join(f"{k}={v}" for k, v in loaded.backend.describe().items())
        print(f"loaded {loaded.entry.name}: {described}", file=self.err, flush=True)
        return Opened(loaded.backend, loaded.entry.name, loaded.decision.plan, loaded.decision.reasons)
