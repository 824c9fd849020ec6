"""Safer configurations to try after a runner crashed or ran out of memory, in order:

1. llama.cpp without extra weight-buffer types (use_extra_bufts=False: no AMX/repacked weights), for backends
   whose capabilities say they honour it;
2. fewer GPU layers (half, then a quarter, then none), after an out-of-memory or a crash with layers on a GPU;
3. the other backend, where it runs the model (the caller says so through `fallback`).

Pure: no processes, no I/O.  `next_config` is asked once per failure and answers the next rung or None (give up).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from backends.api import LoadOptions

OTHER_BACKEND = {"llama.cpp": "torch", "torch": "llama.cpp"}


@dataclass(frozen=True)
class RunnerConfig:
    """What one runner is started with."""

    backend: str  # registry name (or "module:Class")
    options: LoadOptions
    why: str = ""  # "" for the plan's own configuration; else what the ladder changed and why

    def changes(self) -> dict[str, object]:
        """What this configuration overrides, for remembering it (backend and the options the ladder moves)."""
        return {
            "backend": self.backend,
            "extra_bufts": self.options.extra_bufts,
            "n_gpu_layers": self.options.n_gpu_layers,
        }


Fallback = Callable[[str], "LoadOptions | None"]  # backend name -> its options for this model, None = cannot run it


def next_config(
    current: RunnerConfig,
    *,
    n_layers: int,
    failure: str,
    honours_extra_bufts: bool,
    tried_backends: frozenset[str],
    fallback: Fallback | None,
) -> RunnerConfig | None:
    """The next safer configuration after `failure` ("crash" or "oom") of `current`, or None."""
    o = current.options
    if honours_extra_bufts and o.extra_bufts is not False:
        return RunnerConfig(
            current.backend,
            dataclasses.replace(o, extra_bufts=False),
            "without extra weight-buffer types (use_extra_bufts=False: no AMX/repacked weights)",
        )
    on_gpu = o.n_gpu_layers != 0 and not o.device == "cpu"
    if on_gpu:
        layers = n_layers if o.n_gpu_layers < 0 else o.n_gpu_layers
        fewer = layers // 2 if layers > 4 else 0
        what = "out of GPU memory" if failure == "oom" else "a crash with layers on the GPU"
        return RunnerConfig(
            current.backend,
            dataclasses.replace(o, n_gpu_layers=fewer),
            f"with {fewer} of {n_layers} layers on the GPU instead of {layers} (after {what})",
        )
    other = OTHER_BACKEND.get(current.backend)
    if other and other not in tried_backends and fallback is not None:
        options = fallback(other)
        if options is not None:
            return RunnerConfig(other, options, f"on the {other} backend instead of {current.backend}")
    return None
