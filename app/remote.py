"""`--backend remote`: a model on an OpenAI-compatible server, opened from Settings.

No model file, no plan, no runner: the model store and the planner are not asked (the server placed the model),
and the backend runs in hearth's own process (it is HTTP, no native code).  The key comes from
HEARTH_REMOTE_API_KEY or `[remote] api_key` in settings.toml, never from a flag (flags show in `ps`).
"""

from __future__ import annotations

import os

from app.loaded import Decision, Loaded
from app.paths import get_paths
from app.settings import Settings
from app.store import ModelEntry
from backends.api import LoadOptions, ProgressCallback
from backends.engine_options import RemoteTarget
from backends.registry import backend_class
from backends.spec_types import remote_spec
from hwprobe.errors import ConfigError


def key_source(settings: Settings) -> str:
    """Where the remote key came from, for the message when a server refuses it."""
    if os.environ.get("HEARTH_REMOTE_API_KEY"):
        return "HEARTH_REMOTE_API_KEY"
    if settings.remote_api_key:
        return f"[remote] api_key in {get_paths().settings_file}"
    return "nowhere: no key was set"


def open_remote(settings: Settings, *, progress: ProgressCallback | None = None, load: bool = True) -> Loaded:
    if not settings.url:
        raise ConfigError(
            "--backend remote needs the server's URL",
            "pass --url URL (e.g. http://gpu-box:8000), or set url under [remote] in settings.toml",
        )
    target = RemoteTarget(settings.url, settings.remote_model, settings.remote_api_key, key_source(settings))
    # through the registry, like every engine (httpx is imported only now); its target is its own typed option
    remote = backend_class("remote")
    backend = remote(remote_spec(settings.remote_model or "", settings.url), LoadOptions(), target)  # type: ignore[call-arg]
    if load:
        backend.load(progress)
    entry = ModelEntry(name=backend.spec.name or "remote", path=settings.url, source="remote")
    decision = Decision(
        "remote",
        backend.options,
        None,
        (f"served by {target.base}: the server places the model, hearth's plan is not asked",),
    )
    return Loaded(backend, entry, backend.spec, decision)


def remote_hint() -> str:
    """The line `hearth plan` prints when nothing fits this machine."""
    return (
        "or serve it on a bigger machine (vLLM, SGLang, Ollama, `hearth serve`) and chat from here with "
        "`hearth run --backend remote --url http://HOST:PORT`"
    )
