"""hwprobe: what this machine has (probe) and what to do with it (plan).

Light on import (app.settings imports hwprobe.errors): the functions below import their modules when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hwprobe.plan_types import Plan, Prefs
    from hwprobe.report import HardwareReport
    from hwprobe.shape import ModelShape


def probe(model_dir: Any = None) -> "HardwareReport":
    """Measure this machine (see hwprobe.probe)."""
    from hwprobe.probe import probe as _probe

    return _probe(model_dir)


def plan(report: "HardwareReport", shape: "ModelShape", prefs: "Prefs | None" = None) -> "Plan":
    """Decide how to run `shape` on `report`'s machine (see hwprobe.planner)."""
    from hwprobe.planner import plan as _plan

    return _plan(report, shape, prefs)
