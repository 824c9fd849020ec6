"""Start the runner process before the rest of a command runs (backends/runner/prestart.py).

`hearth run` spent ~0.2 s importing its modules, resolving the model, reading the GGUF header, probing the machine
and planning before it started the runner, whose interpreter start and `import torch` (~1.1 s of a ~2 s start)
then came after all of that.  Started first, the runner imports its engine on the other core meanwhile and the
Load message follows the plan.  Light on purpose (the standard library, app.paths, backends.registry's names):
commands call `prestart` before importing the heavy parts of hearth.
"""

from __future__ import annotations

import os
import time

from app.paths import get_paths
from app.settings import Settings, keep_alive_seconds
from backends.registry import LOCAL_BACKENDS
from backends.runner.prestart import Prestarted
from backends.runner.resident import resident_dir, residents


def in_process() -> bool:
    """HEARTH_IN_PROCESS=1: load the engine in hearth's own process (debugging, profiling, unit tests with
    fakes); otherwise every model runs in a runner process (backends/runner)."""
    return os.environ.get("HEARTH_IN_PROCESS", "") not in ("", "0")


def prestart(settings: Settings, lingers: bool = False) -> Prestarted | None:
    """A runner started now, importing the engine --backend / HEARTH_BACKEND_CLASS names (with `auto`, none: the
    plan has not chosen one yet), for open_backend to hand to the first load; None where no runner will run
    (HEARTH_IN_PROCESS=1, a remote backend) or it could not start (the load then starts one the usual way).
    The caller hands it to open_backend or discards it.  `lingers`: the command keeps its runner loaded after it
    ends (`hearth run`, the chat app: app/loading.keep_alive_for); none starts then while an earlier command's
    runner lingers, since that one most likely serves this command."""
    if in_process() or settings.backend == "remote":
        return None
    if lingers and keep_alive_seconds(settings) != 0 and residents(resident_dir(get_paths().data_dir)):
        return None  # a runner an earlier command left loaded will most likely serve this one, already loaded
    name = os.environ.get("HEARTH_BACKEND_CLASS") or settings.backend
    preload = name if name in LOCAL_BACKENDS or ":" in name else None
    log_dir = get_paths().log_dir / "runners"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"runner-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}-pre.log"
        return Prestarted.start(log, False, preload)
    except OSError:
        return None
