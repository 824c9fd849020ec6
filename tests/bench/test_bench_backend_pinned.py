"""`hearth bench --backends torch` measures torch: a configuration remembered on the other backend (one runner
that crashed before its first reply) must not turn `hearth bench --backends torch`'s runner into llama.cpp, as
it did for every bench of the starter after one such crash (app/loading.MEASURING_COMMANDS).  Elsewhere the memory
is in force: a command starts where it last worked."""

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
    run = _runner(starter_spec, "run", "torch")  # the memory is in force: `hearth run` starts where it last worked
    bench = _runner(starter_spec, "bench", "torch")
    try:
        assert run.config.backend == "llama.cpp" and "remembered" in run.config.why
        assert bench.config.backend == "torch" and bench.config.why == "" and bench.name == "torch"
        assert bench.fallback is None  # nor does the ladder move it to llama.cpp after a crash
    finally:
        run.close()
        bench.close()


def test_with_auto_the_remembered_backend_is_in_force(starter_spec):
    """The planner puts the starter on llama.cpp; a remembered switch to torch (llama.cpp crashed there) holds."""
    changes = {"backend": "torch", "n_gpu_layers": 0}
    config_memory().remember(starter_spec, changes, "on the torch backend instead of llama.cpp")
    auto = _runner(starter_spec, "run", "auto")
    try:
        assert auto.config.backend == "torch" and "remembered" in auto.config.why
        assert auto.fallback is not None
    finally:
        auto.close()
