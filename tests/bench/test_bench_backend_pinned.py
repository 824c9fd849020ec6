"""A backend the user names is the backend that runs: a configuration remembered on the other backend (one runner
that crashed before its first reply) must not turn `hearth bench --backends torch`'s runner, or `hearth serve
--backend torch`'s, into llama.cpp, as it did for every bench and soak of the starter after one such crash
(app/loading.MEASURING_COMMANDS and the pinned backend in make_backend).  With backend "auto" the memory is in
force: a command starts where it last worked."""

from __future__ import annotations

import pytest

from app.loading import config_memory, decide, make_backend
from app.settings import Settings
from backends.runner.client import RunnerBackend


@pytest.fixture()
def starter_spec(starter_path, monkeypatch):
    from app.store import ModelStore

    monkeypatch.delenv("HEARTH_IN_PROCESS", raising=False)
    return ModelStore().spec(None)[1]


def _runner(spec, command: str, backend: str) -> RunnerBackend:
    settings = Settings(backend=backend)
    made = make_backend(spec, decide(spec, settings, command=command), settings, command=command)
    assert isinstance(made, RunnerBackend)
    return made


def test_a_bench_keeps_the_backend_it_names_over_a_remembered_other_backend(starter_spec):
    changes = {"backend": "llama.cpp", "extra_bufts": False, "n_gpu_layers": 0}
    config_memory().remember(starter_spec, changes, "on the llama.cpp backend instead of torch")
    for command in ("bench", "serve", "run"):
        pinned = _runner(starter_spec, command, "torch")
        try:
            assert pinned.config.backend == "torch" and pinned.config.why == "" and pinned.name == "torch", command
            assert pinned.fallback is None, command  # nor does the ladder move it to llama.cpp after a crash
        finally:
            pinned.close()


def test_with_auto_the_remembered_backend_is_in_force(starter_spec):
    """The planner puts the starter on llama.cpp; a remembered switch to torch (llama.cpp crashed there) holds for
    "auto", not for a named llama.cpp."""
    changes = {"backend": "torch", "n_gpu_layers": 0}
    config_memory().remember(starter_spec, changes, "on the torch backend instead of llama.cpp")
    auto = _runner(starter_spec, "run", "auto")
    named = _runner(starter_spec, "run", "llama.cpp")
    try:
        assert auto.config.backend == "torch" and "remembered" in auto.config.why
        assert auto.fallback is not None
        assert named.config.backend == "llama.cpp" and named.fallback is None
    finally:
        auto.close()
        named.close()
