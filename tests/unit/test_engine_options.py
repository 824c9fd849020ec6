"""Per-engine load options are typed and checked before a runner starts (backends/engine_options.py: TorchOptions,
LlamaCppOptions, held by the registry), the env-seconds helper has one policy, and on_notice is part of the
Backend contract."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from backends.api import Backend, LoadOptions
from backends.engine_options import (
    LlamaCppKVCacheType,
    LlamaCppOptions,
    TorchDtype,
    TorchKVCacheType,
    TorchOptions,
    TorchWeightQuant,
)
from backends.env import env_seconds
from backends.errors import ConfigError
from backends.registry import BACKENDS, get_backend_info
from tests.fakes import FakeBackend


@pytest.mark.parametrize(
    "backend,change,words",
    [
        ("torch", {"kv_cache_type": "q8_0"}, "torch backend's KV cache type is one of f16"),
        ("torch", {"dtype": "float8"}, "torch backend's dtype"),
        ("torch", {"weight_quant": "q4_k_m"}, "torch backend's weight quantization"),
        ("llama.cpp", {"kv_cache_type": "fp16"}, "llama.cpp backend's KV cache type"),
        ("llama.cpp", {"tensor_parallel": 2}, "--tensor-parallel 2 is the torch engine's"),
    ],
)
def test_a_value_the_engine_does_not_take_is_a_one_line_config_error(backend, change, words) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        get_backend_info(backend).check_options(dataclasses.replace(LoadOptions(), **change))
    assert "\n" not in str(caught.value)


def test_what_the_plan_gives_each_engine_passes_as_that_engines_typed_options() -> None:
    llama = get_backend_info("llama.cpp").check_options(LoadOptions(kv_cache_type="q4_0", flash_attn=True))
    assert llama == LlamaCppOptions(kv_cache_type="q4_0", flash_attn=True, extra_bufts=None)
    torch_options = get_backend_info("torch").check_options(
        LoadOptions(kv_cache_type="bf16", dtype="bfloat16", weight_quant="gguf", tensor_parallel=2)
    )
    assert torch_options == TorchOptions(kv_cache_type="bf16", dtype="bfloat16", weight_quant="gguf", tensor_parallel=2)
    assert get_backend_info("remote").check_options(LoadOptions(kv_cache_type="anything")) is None  # unused


def test_remote_refuses_tensor_parallel_too() -> None:
    with pytest.raises(ConfigError, match="--tensor-parallel 2 is the torch engine's; the remote backend"):
        get_backend_info("remote").check_options(LoadOptions(tensor_parallel=2))


def test_the_rules_agree_with_the_engines_own_tables() -> None:
    """The registry states them without importing the engines; here they are compared with the engines."""
    assert BACKENDS["torch"].options is TorchOptions and BACKENDS["llama.cpp"].options is LlamaCppOptions
    pytest.importorskip("torch")
    from backends.llama_cpp.backend import KV_TYPES
    from backends.torch_engine.model_runner import _DTYPES, _KV_DTYPES, WEIGHT_QUANTS

    assert set(get_args(TorchKVCacheType)) == set(_KV_DTYPES)
    assert set(get_args(TorchDtype)) == {"auto", *_DTYPES}
    assert set(get_args(TorchWeightQuant)) == set(WEIGHT_QUANTS)
    assert set(get_args(LlamaCppKVCacheType)) == set(KV_TYPES)


def test_the_command_line_refuses_before_any_runner_loads(starter_path: Path, hearth_home: Path) -> None:
    """Before: the runner started, loaded the weights and failed in the child.  Now: one line, exit 2, and no
    runner loads anything: the one `hearth run` starts before it plans (app/runner_start.py) is ended when the
    plan refuses, and leaves no log behind."""
    env = {**os.environ, "HEARTH_HOME": str(hearth_home)}
    args = [sys.executable, "-m", "app", "run", "--model", str(starter_path), "--backend", "torch"]
    result = subprocess.run(
        [*args, "--kv-cache-type", "q8_0", "--max-tokens", "1", "hi"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "KV cache type is one of f16" in result.stderr and "Traceback" not in result.stderr
    assert not list(hearth_home.rglob("runner-*.log"))


@pytest.mark.parametrize("raw,want", [("", 7.0), ("2", 2.0), (" 0.5 ", 0.5)])
def test_env_seconds(monkeypatch, raw, want) -> None:
    monkeypatch.setenv("HEARTH_TEST_SECONDS", raw)
    assert env_seconds("HEARTH_TEST_SECONDS", 7.0) == want


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "nan", "inf"])
def test_env_seconds_refuses_what_is_not_a_positive_number(monkeypatch, raw) -> None:
    monkeypatch.setenv("HEARTH_TEST_SECONDS", raw)
    with pytest.raises(ConfigError, match="HEARTH_TEST_SECONDS"):
        env_seconds("HEARTH_TEST_SECONDS", 7.0)


def test_on_notice_is_part_of_the_contract_with_a_no_op_default() -> None:
    assert "on_notice" in vars(Backend)
    backend = FakeBackend.__new__(FakeBackend)
    backend.on_notice("the runner crashed")  # dropped, no error
    seen: list[str] = []
    backend.on_notice = seen.append  # what a front end does
    backend.on_notice("restarting")
    assert seen == ["restarting"]
