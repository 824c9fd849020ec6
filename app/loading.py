"""From Settings to a loaded Backend: resolve the model, decide placement, load lazily.

This is the one path every command (run, chat, serve, bench, ppl) and the TUI use, so a model behaves the same
wherever it is opened.  `decide()` is where the hardware plan (hwprobe.plan) turns into LoadOptions; flags the
user gave always win over the plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from app.settings import Settings
from app.store import ModelEntry, ModelStore
from backends.api import Backend, LoadOptions, ProgressCallback
from backends.modelspec import ModelSpec
from backends.registry import get_backend_info


@dataclass
class Decision:
    backend: str  # registry name
    options: LoadOptions
    plan: Any | None = None  # hwprobe Plan when one was made
    reasons: tuple[str, ...] = ()


@dataclass
class Loaded:
    backend: Backend
    entry: ModelEntry
    spec: ModelSpec
    decision: Decision


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def decide(spec: ModelSpec, settings: Settings, hardware_file: str | None = None) -> Decision:
    """Choose backend and LoadOptions for this model on this machine (flags in `settings` override)."""
    backend = settings.backend
    if backend == "auto":
        backend = "llama.cpp" if spec.format == "gguf" else "torch"
    ctx = settings.ctx or min(spec.context_length, 4096)
    options = LoadOptions(
        n_ctx=ctx,
        n_gpu_layers=settings.n_gpu_layers if settings.n_gpu_layers is not None else 0,
        kv_cache_type=settings.kv_cache_type or "f16",
        n_threads=settings.threads or physical_cores(),
        max_num_seqs=settings.max_concurrency,
    )
    return Decision(backend, options, None, (f"context {ctx} tokens (model trained on {spec.context_length})",))


def open_backend(settings: Settings, *, hardware_file: str | None = None, progress: ProgressCallback | None = None,
                 store: ModelStore | None = None, load: bool = True) -> Loaded:
    store = store or ModelStore()
    entry, spec = store.spec(settings.model)
    decision = decide(spec, settings, hardware_file)
    cls = get_backend_info(decision.backend).load_class()
    backend = cls(spec, decision.options)
    if load:
        backend.load(progress)
        if entry.source != "path":
            try:
                store.update_state(last_model=entry.name)
            except OSError:
                pass
    return Loaded(backend, entry, spec, decision)
