"""What opening a model decided and produced: the seam between app/loading.py (local models) and
app/remote.py (`--backend remote`), in its own module so that neither imports the other's caller."""

from __future__ import annotations

from dataclasses import dataclass

from app.store import ModelEntry
from backends.api import Backend, LoadOptions
from backends.modelspec import ModelSpec
from hwprobe.plan_types import Plan


@dataclass
class Decision:
    backend: str  # registry name
    options: LoadOptions
    plan: Plan | None = None  # hwprobe Plan when one was made (None for a remote server)
    reasons: tuple[str, ...] = ()


@dataclass
class Loaded:
    backend: Backend
    entry: ModelEntry
    spec: ModelSpec
    decision: Decision
