"""The safer-configuration ladder: its order, and a runner that runs out of GPU memory at load."""

from __future__ import annotations

import dataclasses

from backends.api import LoadOptions, Request
from backends.runner.client import RunnerBackend
from backends.runner.ladder import RunnerConfig, next_config
from tests.fakes import fake_spec


def _walk(config: RunnerConfig, *, extra: bool, fallback) -> list[RunnerConfig]:  # type: ignore[no-untyped-def]
    seen, tried = [], {config.backend}
    while (
        config := next_config(
            config,
            n_layers=32,
            failure="crash",
            honours_extra_bufts=extra and config.backend == "llama.cpp",
            tried_backends=frozenset(tried),
            fallback=fallback,
        )
    ) is not None:
        seen.append(config)
        tried.add(config.backend)
    return seen


def test_order_extra_bufts_then_fewer_gpu_layers_then_the_other_backend() -> None:
    steps = _walk(
        RunnerConfig("llama.cpp", LoadOptions(n_gpu_layers=-1)),
        extra=True,
        fallback=lambda b: LoadOptions(device="cpu") if b == "torch" else None,
    )
    assert steps[0].options.extra_bufts is False and "use_extra_bufts=False" in steps[0].why
    assert [s.options.n_gpu_layers for s in steps[1:5]] == [16, 8, 4, 0]
    assert all(s.options.extra_bufts is False for s in steps[1:5])
    assert steps[-1].backend == "torch" and "instead of llama.cpp" in steps[-1].why
    assert len(steps) == 6  # then nothing is left


def test_cpu_only_torch_goes_straight_to_llama_cpp_or_gives_up() -> None:
    cpu = RunnerConfig("torch", LoadOptions(device="cpu"))
    assert [s.backend for s in _walk(cpu, extra=True, fallback=lambda b: LoadOptions())] == ["llama.cpp", "llama.cpp"]
    assert _walk(cpu, extra=True, fallback=lambda b: None) == []  # llama.cpp cannot run it: nothing safer


def test_a_gpu_out_of_memory_at_load_retries_with_fewer_layers(tmp_path) -> None:
    spec = dataclasses.replace(fake_spec(), n_layers=32)
    b = RunnerBackend(
        spec, LoadOptions(n_ctx=2048, n_gpu_layers=-1), backend="tests.runner_fakes:GpuOomFake", log_dir=tmp_path
    )
    progress: list[str] = []
    b.load(lambda f, what: progress.append(what))
    try:
        assert b.options.n_gpu_layers == 8  # all 32 -> 16 (out of memory again) -> 8, which loads
        assert sum("ran out of memory" in n for n in b.notices) == 2
        assert any(w.startswith("retrying with 8 of 32 layers on the GPU instead of 16") for w in progress)
        assert b.generate(Request(prompt="hi")).text.startswith("one two")
    finally:
        b.close()
