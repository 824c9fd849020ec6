"""A runner started before the model is planned (backends/runner/process.Prestarted, app/loading.prestart): the
first load adopts it and it then behaves as a runner started at load: refusals keep their type, a crash at load
is a crash, a preload that fails is reported by the Load; one that cannot serve the configuration, or is never
used, is ended.  Real runner processes with the fakes of tests/runner_fakes.py."""

from __future__ import annotations

import pytest

from backends.api import FinishReason, LoadOptions, Request
from backends.errors import RunnerCrashedError, UnsupportedArchitectureError
from backends.runner.client import RunnerBackend
from backends.runner.prestart import Prestarted
from tests.fakes import fake_spec

CRASHING = "tests.runner_fakes:CrashingFake"


def _prestarted(tmp_path, preload):  # type: ignore[no-untyped-def]
    (tmp_path / "logs").mkdir(exist_ok=True)
    return Prestarted.start(tmp_path / "logs" / "pre.log", False, preload)


def _backend(tmp_path, name, started):  # type: ignore[no-untyped-def]
    spec = fake_spec(path=str(tmp_path / "fake.gguf"))
    return RunnerBackend(spec, LoadOptions(n_ctx=2048), backend=name, log_dir=tmp_path / "logs", prestarted=started)


def _ended(started: Prestarted) -> bool:
    try:
        started.proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - still running
        return False
    return True


def test_the_first_load_adopts_the_prestarted_runner(tmp_path):
    started = _prestarted(tmp_path, CRASHING)
    b = _backend(tmp_path, CRASHING, started)
    b.load()
    assert b.pid == started.proc.pid
    assert b.generate(Request(prompt="hello")).finish_reason is FinishReason.STOP
    b.close()
    assert _ended(started)


@pytest.mark.parametrize("preload", [None, "tests.runner_fakes:UnsupportedOnLoadFake"])
def test_a_refusal_at_load_keeps_its_type(tmp_path, preload):
    started = _prestarted(tmp_path, preload)
    b = _backend(tmp_path, "tests.runner_fakes:UnsupportedOnLoadFake", started)
    with pytest.raises(UnsupportedArchitectureError, match="fake refuses architecture 'nope'"):
        b.load()
    assert _ended(started)
    b.close()


def test_a_crash_at_load_is_a_crash(tmp_path):
    name = "tests.runner_fakes:CrashOnLoadFake"
    b = _backend(tmp_path, name, _prestarted(tmp_path, name))
    with pytest.raises(RunnerCrashedError, match="SIGSEGV"):
        b.load()
    b.close()


def test_a_preload_that_fails_is_reported_by_the_load(tmp_path):
    name = "tests.no_such_fake_module:Fake"
    b = _backend(tmp_path, name, _prestarted(tmp_path, name))
    with pytest.raises(Exception, match="no_such_fake_module"):
        b.load()
    b.close()


def test_a_runner_that_imported_another_backend_is_ended_and_a_new_one_loads(tmp_path):
    started = _prestarted(tmp_path, "tests.runner_fakes:UnsupportedOnLoadFake")
    b = _backend(tmp_path, CRASHING, started)
    b.load()
    assert b.pid != started.proc.pid and _ended(started)
    b.close()


def test_closed_before_loading_ends_it(tmp_path):
    started = _prestarted(tmp_path, CRASHING)
    _backend(tmp_path, CRASHING, started).close()
    assert _ended(started)


def test_open_backend_ends_it_when_the_model_cannot_be_resolved(tmp_path, monkeypatch):
    from app import loading
    from app.settings import Settings
    from backends.errors import HearthError

    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HEARTH_IN_PROCESS", raising=False)
    made: list[Prestarted] = []
    real = loading.prestart
    monkeypatch.setattr(loading, "prestart", lambda settings, *a: made.append(real(settings, *a)) or made[-1])
    with pytest.raises(HearthError):
        loading.open_backend(Settings(model=str(tmp_path / "missing.gguf"), backend="torch"))
    assert len(made) == 1 and made[0] is not None and made[0].preload == "torch"
    assert _ended(made[0])


def test_a_discarded_runner_that_said_nothing_leaves_no_log(tmp_path):
    started = _prestarted(tmp_path, None)
    assert started.log_path.exists()
    started.discard()
    assert _ended(started) and not started.log_path.exists()


def test_a_discarded_runner_keeps_a_log_that_says_something(tmp_path):
    started = _prestarted(tmp_path, None)
    started.log_path.write_text("runner: something worth keeping\n")
    started.discard()
    assert _ended(started) and started.log_path.read_text() == "runner: something worth keeping\n"
