"""What hearth knows of a remote model: its name and where it is served.  Nothing of its shapes (0 = unknown):
the planner and the model store never see a remote model, and its server applies its chat template."""

from __future__ import annotations

from backends.engine_options import RemoteTarget
from backends.spec_types import remote_spec

__all__ = ["RemoteTarget", "api_base", "remote_spec"]


def api_base(url: str) -> str:
    return RemoteTarget(url).base
