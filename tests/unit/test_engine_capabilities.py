"""One source of capabilities (backends/engine_capabilities.py): the registry lists, without importing an engine,
exactly what each engine class declares, and a runner's client reports the same (the torch engine's logprobs
read False under the runner when the registry kept a copy of its own)."""

from __future__ import annotations

import pytest

from backends import engine_capabilities
from backends.registry import BACKENDS, get_backend_info


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_the_registry_and_the_engine_class_declare_the_same_capabilities(name: str) -> None:
    info = get_backend_info(name)
    if not info.is_installed():
        pytest.skip(f"{name} is not installed here")
    assert info.load_class().capabilities is info.capabilities


def test_a_runner_reports_what_its_engine_declares(tmp_path) -> None:
    from backends.api import LoadOptions
    from backends.runner.client import RunnerBackend
    from tests.fakes import fake_spec

    for name, want in (("torch", engine_capabilities.TORCH), ("llama.cpp", engine_capabilities.LLAMA_CPP)):
        runner = RunnerBackend(fake_spec(path=str(tmp_path / "x.gguf")), LoadOptions(), backend=name)
        assert runner.capabilities == want and runner.capabilities.logprobs and runner.capabilities.constraints
